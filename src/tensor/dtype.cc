// DType table and scalar loads.
#include "tensor/dtype.h"

#include <cstring>

#include "base/check.h"
#include "numeric/float_formats.h"

namespace dsinfer {

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E8M0:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF64:
      return "F64";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_name(const std::string& s) {
  static const DType all[] = {DType::kF64,
                              DType::kF32,
                              DType::kF16,
                              DType::kBF16,
                              DType::kF8E4M3,
                              DType::kF8E8M0,
                              DType::kI64,
                              DType::kI32,
                              DType::kI16,
                              DType::kI8,
                              DType::kU8,
                              DType::kBool};
  for (DType t : all) {
    if (s == dtype_name(t))
      return t;
  }
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

bool dtype_is_integer(DType t) {
  return t == DType::kI64 || t == DType::kI32 || t == DType::kI16 || t == DType::kI8 ||
         t == DType::kU8;
}

float load_float(const void* data, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::kF64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return static_cast<float>(d);
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return numeric::f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return numeric::bf16_to_f32(h);
    }
    case DType::kF8E4M3:
      return numeric::fp8_e4m3_to_f32(p[i]);
    case DType::kF8E8M0:
      return numeric::e8m0_to_f32(p[i]);
    case DType::kI64:
    case DType::kI32:
    case DType::kI16:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      break;
  }
  DSI_CHECK(false, "load_float on non-float dtype %s", dtype_name(t));
  return 0.0f;
}

int64_t load_int(const void* data, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kI16: {
      int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case DType::kI8:
      return static_cast<int8_t>(p[i]);
    case DType::kU8:
    case DType::kBool:
      return p[i];
    case DType::kF64:
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E8M0:
      break;
  }
  DSI_CHECK(false, "load_int on non-integer dtype %s", dtype_name(t));
  return 0;
}

}  // namespace dsinfer
