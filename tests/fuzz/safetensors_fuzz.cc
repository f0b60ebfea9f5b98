// libFuzzer: SafetensorsFile::parse on arbitrary bytes. Every accepted file must describe tensors
// that lie inside the input (touched here so ASan catches any out-of-bounds view).
#include <cstddef>
#include <cstdint>

#include "tensor/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = dsinfer::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (!r.ok()) {
    return 0;
  }
  volatile uint8_t sink = 0;
  for (const dsinfer::TensorInfo& t : (*r)->tensors()) {
    if (t.numel() * dsinfer::dtype_size(t.dtype) != t.nbytes) {
      __builtin_trap();
    }
    if ((*r)->find(t.name) != &t) {
      __builtin_trap();
    }
    if (t.nbytes > 0) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      if (p < data || p + t.nbytes > data + size) {
        __builtin_trap();
      }
      sink = sink ^ p[0] ^ p[t.nbytes - 1];
    }
  }
  (void)sink;
  return 0;
}
