// dsinfer._core: the engine for Python (nanobind). The pure-Python layer (python/dsinfer) turns
// SamplingParams and prompts into request objects of the JSONL request format and hands them
// over as JSON text; this module runs them through the same frontend code as `dsinfer generate`
// (frontend/offline.h) and returns the same result objects, as JSON text.
//
// The GIL is released while the engine steps; between steps the module checks Python's signals
// (Ctrl-C) and calls the progress callback. An exception there aborts every request of the call,
// so the engine is idle and usable again when it propagates. Errors: a bad argument or request is
// a ValueError carrying the engine's message; a missing file is FileNotFoundError; the rest
// RuntimeError.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "frontend/offline.h"
#include "model/checkpoint.h"
#include "state/page_arena.h"
#include "state/sequence_state.h"
#include "tokenizer/tokenizer.h"

namespace nb = nanobind;

namespace dsinfer::python {
namespace {

using json = nlohmann::ordered_json;

// Raises the Python exception that matches the status (never returns).
[[noreturn]] void raise_status(const Status& s) {
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
      type = PyExc_ValueError;
      break;
    case StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, s.message().c_str());
  throw nb::python_error();
}

[[noreturn]] void raise_value_error(const std::string& msg) {
  PyErr_SetString(PyExc_ValueError, msg.c_str());
  throw nb::python_error();
}

// One request of a generate() call.
struct Job {
  frontend::OfflineJob job;
  std::vector<frontend::TokenLogprobs> logprobs;
  engine::RequestId id = 0;
};

class Engine {
 public:
  Engine(const std::string& model,
         const std::string& device,
         const std::string& numerics,
         const std::string& state_memory,
         int64_t max_num_seqs,
         int64_t max_tokens_per_step,
         int64_t max_model_len,
         const std::string& model_version,
         bool cuda_graphs,
         bool async_scheduling,
         const std::string& cpu_kernels,
         int cpu_threads) {
    cli::EngineFlags f;
    f.model_dir = model;
    f.device = device;
    f.numerics = numerics;
    f.state_memory = state_memory;
    f.max_num_seqs = max_num_seqs;
    f.max_tokens_per_step = max_tokens_per_step;
    f.max_model_len = max_model_len;
    f.model_version = model_version;
    f.no_cuda_graphs = !cuda_graphs;
    f.async_scheduling = async_scheduling;
    f.cpu_kernels = cpu_kernels;
    f.cpu_threads = cpu_threads;
    if (max_num_seqs < 1)
      raise_value_error("max_num_seqs must be >= 1");
    if (max_tokens_per_step < 1)
      raise_value_error("max_tokens_per_step must be >= 1");
    auto setup = cli::resolve_engine_flags(f);
    if (!setup.ok())
      raise_status(setup.status());
    config_ = setup->config;
    version_ = setup->version;
    Status st;
    {
      nb::gil_scoped_release unlocked;
      st = load();
    }
    if (!st.ok())
      raise_status(st);
  }

  // Runs the requests (JSON objects of the JSONL request format) to completion and returns one
  // result object (JSON text) per request, in order. Every request is validated before any runs:
  // a bad one raises ValueError("request i: ...") and nothing is submitted. `progress` (or None)
  // is called between steps as progress(done, total, prompt_tokens, generated_tokens).
  std::vector<std::string> generate(const std::vector<std::string>& requests, nb::object progress) {
    std::vector<Job> jobs(requests.size());
    frontend::OfflineDefaults defaults;
    // DeepSeek V4.1's tokenizer policy: text prompts get BOS (as `dsinfer generate`).
    defaults.text_prompt_bos = engine_->model().text_prompt_bos();
    for (size_t i = 0; i < requests.size(); ++i) {
      json line = json::parse(requests[i], nullptr, false);
      if (line.is_discarded())
        raise_value_error("request " + std::to_string(i) + " is not valid JSON");
      jobs[i].job = frontend::make_offline_job(line, defaults, tok_.get(), version_);
      if (!jobs[i].job.error.empty())
        raise_value_error(prefix(i, requests.size()) + jobs[i].job.error);
    }
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    {
      nb::gil_scoped_release unlocked;
      lock.lock();
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      Job& j = jobs[i];
      engine::TokenCallback on_token;
      if (j.job.logprobs > 0) {
        on_token = [&j](const engine::TokenEvent& ev) {
          j.logprobs.push_back({ev.token, ev.logprob, ev.top_logprobs});
        };
      }
      auto id = engine_->submit(std::move(j.job.spec), std::move(on_token));
      if (!id.ok()) {
        abort_all(jobs);
        raise_value_error(prefix(i, jobs.size()) + id.status().message());
      }
      j.id = *id;
    }
    const int64_t total = static_cast<int64_t>(jobs.size());
    int64_t last_done = -1;
    const engine::EngineStats base = engine_->stats();
    while (true) {
      Result<bool> more = true;
      {
        nb::gil_scoped_release unlocked;
        more = engine_->step_all_ranks();
      }
      if (!more.ok() || !*more)
        break;
      if (PyErr_CheckSignals() != 0) {
        abort_all(jobs);
        throw nb::python_error();
      }
      if (!progress.is_none()) {
        int64_t done = 0;
        for (const Job& j : jobs) done += engine_->request(j.id)->done();
        const engine::EngineStats st = engine_->stats();
        if (done != last_done || st.steps % 8 == 0) {
          last_done = done;
          try {
            progress(done,
                     total,
                     st.prompt_tokens - base.prompt_tokens,
                     st.generated_tokens - base.generated_tokens);
          } catch (...) {
            abort_all(jobs);
            throw;
          }
        }
      }
    }
    if (Status h = engine_->health(); !h.ok()) {
      abort_all(jobs);
      raise_status(h);
    }
    std::vector<std::string> out;
    out.reserve(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Job& j = jobs[i];
      json o = frontend::offline_result(
          static_cast<int64_t>(i), j.job, *engine_->request(j.id), tok_.get(), j.logprobs);
      o["prompt_token_ids"] = j.job.prompt;
      out.push_back(o.dump(-1, ' ', false, json::error_handler_t::replace));
      engine_->release(j.id);
    }
    return out;
  }

  // Logits at every position of `ids` ([T, vocab] float32), one full forward over a fresh
  // sequence (what `dsinfer score` writes), on a backend of its own made at first use.
  nb::ndarray<nb::numpy, float, nb::ndim<2>> score(const std::vector<int32_t>& ids) {
    if (ids.empty())
      raise_value_error("score: no token ids given");
    const int64_t vocab = vocab_size();
    auto* logits = new std::vector<float>();
    Status st;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard<std::mutex> lock(mu_);
      st = score_into(ids, logits);
    }
    if (!st.ok()) {
      delete logits;
      raise_status(st);
    }
    nb::capsule owner(logits, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    const size_t shape[2] = {ids.size(), static_cast<size_t>(vocab)};
    return nb::ndarray<nb::numpy, float, nb::ndim<2>>(logits->data(), 2, shape, owner);
  }

  std::vector<int32_t> encode(const std::string& text, bool allow_special) const {
    const tokenizer::Tokenizer& t = need_tokenizer();
    auto ids = t.encode(text, allow_special);
    if (!ids.ok())
      raise_status(ids.status());
    return std::move(ids).value();
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const {
    const tokenizer::Tokenizer& t = need_tokenizer();
    auto text = t.decode(ids, skip_special);
    if (!text.ok())
      raise_status(text.status());
    return std::move(text).value();
  }

  bool has_tokenizer() const { return tok_ != nullptr; }
  int64_t vocab_size() const { return engine_->model_config().vocab_size; }
  int64_t max_model_len() const {
    return config_.max_model_len > 0 ? config_.max_model_len
                                     : engine_->model_config().max_position_embeddings;
  }
  // The prompt format chat() renders: "v4", "v4-0731" or "v4.1" (auto: from the checkpoint).
  std::string model_version() const {
    switch (version_) {
      case recipe::ModelVersion::kV4:
        return "v4";
      case recipe::ModelVersion::kV40731:
        return "v4-0731";
      case recipe::ModelVersion::kV41:
        return "v4.1";
    }
    return "v4";
  }
  std::string model_dir() const { return config_.model_dir; }
  std::string backend_name() const { return engine_->model().name(); }

 private:
  Status load() {
    if (cpu_v41::is_v41_model_dir(config_.model_dir)) {
      // DeepSeek V4.1: the engine opens the V4.1 backend (its own checkpoint reader).
      v41_ = true;
      DSI_ASSIGN_OR_RETURN(engine_, engine::Engine::create(config_));
    } else {
      DSI_ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt,
                           model::Checkpoint::open(config_.model_dir));
      ckpt_ = std::move(ckpt);
      DSI_ASSIGN_OR_RETURN(engine_, engine::Engine::create(config_, ckpt_));
    }
    const std::string tok_path = config_.model_dir + "/tokenizer.json";
    if (FILE* f = std::fopen(tok_path.c_str(), "rb")) {
      std::fclose(f);
      DSI_ASSIGN_OR_RETURN(tok_, tokenizer::Tokenizer::load(tok_path));
    }
    return Status();
  }

  const tokenizer::Tokenizer& need_tokenizer() const {
    if (!tok_)
      raise_value_error("the model directory " + config_.model_dir + " has no tokenizer.json");
    return *tok_;
  }

  static std::string prefix(size_t i, size_t n) {
    return n == 1 ? std::string() : "request " + std::to_string(i) + ": ";
  }

  // Aborts and drops every submitted request of a generate() call; the engine is idle after.
  void abort_all(std::vector<Job>& jobs) {
    for (Job& j : jobs) {
      if (j.id == 0)
        continue;
      engine_->abort(j.id, "interrupted");
      engine_->release(j.id);
      j.id = 0;
    }
  }

  Status score_into(const std::vector<int32_t>& ids, std::vector<float>* logits) {
    if (v41_) {
      // The V4.1 forward over the whole sequence (exact prefill: every row's logits), on a
      // backend of its own (the engine's serves generate()).
      if (!score_v41_) {
        cpu_v41::V41BackendOptions o;
        o.numerics = config_.numerics;
        DSI_ASSIGN_OR_RETURN(score_v41_, cpu_v41::V41Backend::open(config_.model_dir, o));
      }
      const cpu_v41::V41CpuModel& m = score_v41_->v41();
      cpu_v41::V41SequenceState st = cpu_v41::make_v41_state(m.config());
      return m.forward(st, std::span<const int32_t>(ids), logits);
    }
    const model::ModelConfig& cfg = ckpt_->config();
    if (!score_model_) {
      DSI_ASSIGN_OR_RETURN(score_model_, engine::create_model(config_, cfg, ckpt_->weights()));
    }
    auto arena =
        state::PageArena::growable(state::default_page_bytes(cfg), score_model_->state_storage());
    state::SequenceState st(cfg, arena.get(), 0, 0, score_model_->row_format());
    backend::ForwardOptions opts;
    backend::ForwardOutputs out;
    DSI_RETURN_IF_ERROR(score_model_->forward(st, std::span<const int32_t>(ids), opts, &out));
    *logits = std::move(out.logits);
    return Status();
  }

  engine::EngineConfig config_;
  recipe::ModelVersion version_ = recipe::ModelVersion::kV4;
  std::shared_ptr<const model::Checkpoint> ckpt_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<backend::Model> score_model_;
  bool v41_ = false;
  std::unique_ptr<cpu_v41::V41Backend> score_v41_;
  std::mutex mu_;  // one generate()/score() drives the engine at a time
};

}  // namespace
}  // namespace dsinfer::python

NB_MODULE(_core, m) {
  using dsinfer::python::Engine;
  m.doc() = "dsinfer's engine (C++), driven by the dsinfer package; use dsinfer.LLM instead.";
  nb::class_<Engine>(m, "Engine", "One engine over a model directory (see dsinfer.LLM).")
      .def(nb::init<const std::string&,
                    const std::string&,
                    const std::string&,
                    const std::string&,
                    int64_t,
                    int64_t,
                    int64_t,
                    const std::string&,
                    bool,
                    bool,
                    const std::string&,
                    int>(),
           nb::arg("model"),
           nb::arg("device"),
           nb::arg("numerics"),
           nb::arg("state_memory"),
           nb::arg("max_num_seqs"),
           nb::arg("max_tokens_per_step"),
           nb::arg("max_model_len"),
           nb::arg("model_version"),
           nb::arg("cuda_graphs"),
           nb::arg("async_scheduling"),
           nb::arg("cpu_kernels"),
           nb::arg("cpu_threads"))
      .def("generate",
           &Engine::generate,
           nb::arg("requests"),
           nb::arg("progress").none(),
           "Runs JSON request objects to completion; returns JSON result objects, in order.")
      .def("score", &Engine::score, nb::arg("token_ids"), "Logits [T, vocab] at every position.")
      .def("encode",
           &Engine::encode,
           nb::arg("text"),
           nb::arg("allow_special") = false,
           "Text -> token ids (no BOS added).")
      .def("decode",
           &Engine::decode,
           nb::arg("token_ids"),
           nb::arg("skip_special") = true,
           "Token ids -> text.")
      .def_prop_ro("has_tokenizer", &Engine::has_tokenizer)
      .def_prop_ro("vocab_size", &Engine::vocab_size)
      .def_prop_ro("max_model_len", &Engine::max_model_len)
      .def_prop_ro("model_dir", &Engine::model_dir)
      .def_prop_ro("model_version", &Engine::model_version)
      .def_prop_ro("backend_name", &Engine::backend_name);
}
