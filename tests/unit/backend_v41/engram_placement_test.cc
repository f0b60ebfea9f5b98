// --engram-placement: the spellings, the named errors of bad values, `device` refused off the
// CUDA V4.1 backend (the flag parser, the CPU backend, the Engram store, the engine on a V4
// checkpoint), through the same paths `generate`, `serve` and `bench` take.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu_v41/backend.h"
#include "backend/cpu_v41/engram_store.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "model_v41/checkpoint.h"

namespace dsinfer {
namespace {

using cpu_v41::EngramPlacement;

const std::string kTiny = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny/official";

bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(V41EngramPlacement, SpellingsRoundTrip) {
  for (EngramPlacement p : {EngramPlacement::kAuto,
                            EngramPlacement::kHost,
                            EngramPlacement::kMapped,
                            EngramPlacement::kDevice}) {
    auto back = cpu_v41::parse_engram_placement(cpu_v41::engram_placement_name(p));
    ASSERT_TRUE(back.ok()) << cpu_v41::engram_placement_name(p);
    EXPECT_EQ(*back, p);
  }
  EXPECT_STREQ(cpu_v41::engram_placement_name(EngramPlacement::kDevice), "device");
}

TEST(V41EngramPlacement, FlagErrorsNameTheFlagAndTheValue) {
  for (const char* bad : {"gpu", "", "Device", "host,device"}) {
    auto p = cli::parse_engram_placement_flag(bad, engine::Device::kCuda);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(p.status(), "--engram-placement")) << p.status().to_string();
    EXPECT_TRUE(contains(p.status(), std::string("`") + bad + "`")) << p.status().to_string();
    EXPECT_TRUE(contains(p.status(), "auto, host, mapped or device")) << p.status().to_string();
  }
  // device only with a CUDA device.
  auto cpu = cli::parse_engram_placement_flag("device", engine::Device::kCpu);
  ASSERT_FALSE(cpu.ok());
  EXPECT_TRUE(contains(cpu.status(), "--engram-placement device needs --device cuda"))
      << cpu.status().to_string();
  EXPECT_EQ(*cli::parse_engram_placement_flag("device", engine::Device::kCuda),
            EngramPlacement::kDevice);
  for (engine::Device d : {engine::Device::kCpu, engine::Device::kCuda}) {
    EXPECT_EQ(*cli::parse_engram_placement_flag("auto", d), EngramPlacement::kAuto);
    EXPECT_EQ(*cli::parse_engram_placement_flag("host", d), EngramPlacement::kHost);
    EXPECT_EQ(*cli::parse_engram_placement_flag("mapped", d), EngramPlacement::kMapped);
  }
}

TEST(V41EngramPlacement, EngineFlagsCarryThePlacement) {
  cli::EngineFlags f;
  f.model_dir = kTiny;
  auto s = cli::resolve_engine_flags(f);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->config.engram_placement, EngramPlacement::kAuto);  // the default: today's path
  f.engram_placement = "mapped";
  s = cli::resolve_engine_flags(f);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->config.engram_placement, EngramPlacement::kMapped);
  f.engram_placement = "device";  // --device cpu (the default)
  s = cli::resolve_engine_flags(f);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.status(), "needs --device cuda")) << s.status().to_string();
  f.device = "cuda";
  s = cli::resolve_engine_flags(f);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->config.engram_placement, EngramPlacement::kDevice);
  f.engram_placement = "pinned";
  s = cli::resolve_engine_flags(f);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.status(), "--engram-placement")) << s.status().to_string();
}

TEST(V41EngramPlacement, DeviceIsRefusedOffTheCudaBackend) {
  // The store and the CPU backend: FailedPrecondition naming the CUDA backend.
  auto ck = model_v41::V41Checkpoint::open(kTiny);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto store = cpu_v41::EngramStore::create(
      (*ck)->config(), (*ck)->weights(), {EngramPlacement::kDevice, 0});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(store.status(), "needs the CUDA V4.1 backend"))
      << store.status().to_string();
  cpu_v41::V41BackendOptions o;
  o.engram.placement = EngramPlacement::kDevice;
  auto b = cpu_v41::V41Backend::open(kTiny, o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(b.status(), "needs the CUDA V4.1 backend")) << b.status().to_string();
  // The engine on the CPU: the same error; the host placements open.
  engine::EngineConfig ec;
  ec.model_dir = kTiny;
  ec.engram_placement = EngramPlacement::kDevice;
  auto e = engine::Engine::create(ec);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(contains(e.status(), "needs the CUDA V4.1 backend")) << e.status().to_string();
  for (EngramPlacement p : {EngramPlacement::kHost, EngramPlacement::kMapped}) {
    ec.engram_placement = p;
    auto ok = engine::Engine::create(ec);
    EXPECT_TRUE(ok.ok()) << ok.status().to_string();
  }
}

TEST(V41EngramPlacement, OnlyAutoOnANonV41Checkpoint) {
  engine::EngineConfig ec;
  ec.model_dir = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official";
  ec.engram_placement = EngramPlacement::kHost;
  auto e = engine::Engine::create(ec);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(contains(e.status(), "--engram-placement applies to DeepSeek V4.1 checkpoints only"))
      << e.status().to_string();
}

}  // namespace
}  // namespace dsinfer
