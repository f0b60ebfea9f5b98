// Element types as they appear in safetensors files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dsinfer {

enum class DType {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // safetensors "F8_E4M3" (the fn variant)
  kF8E8M0,  // safetensors "F8_E8M0" (UE8M0 scale bytes)
  kI64,
  kI32,
  kI16,
  kI8,  // also packed FP4 E2M1 pairs in the official MXFP4 expert tensors
  kU8,
  kBool,
};

// Bytes per element.
int64_t dtype_size(DType t);
// safetensors spelling, e.g. "BF16".
const char* dtype_name(DType t);
// Parses a safetensors dtype string; nullopt for unknown ones (caller reports the error).
std::optional<DType> dtype_from_name(const std::string& s);
bool dtype_is_float(DType t);    // F64/F32/F16/BF16
bool dtype_is_integer(DType t);  // I64/I32/I16/I8/U8

// Reads element i of a float tensor of type t as fp32 (F64/F32/F16/BF16/F8E4M3/F8E8M0).
float load_float(const void* data, DType t, int64_t i);
// Reads element i of an integer tensor of type t as int64.
int64_t load_int(const void* data, DType t, int64_t i);

}  // namespace dsinfer
