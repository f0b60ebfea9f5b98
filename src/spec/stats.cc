#include "spec/stats.h"

#include <algorithm>

#include "base/strings.h"

namespace dsinfer::spec {

void Stats::resize(int32_t max_k) {
  const size_t k = static_cast<size_t>(std::max(max_k, 0));
  verified.resize(k, 0);
  accepted.resize(k, 0);
  verify_len.resize(k + 1, 0);
}

double Stats::acceptance(size_t i) const {
  return i < verified.size() && verified[i] > 0
             ? static_cast<double>(accepted[i]) / static_cast<double>(verified[i])
             : 0.0;
}

double Stats::mean_accepted_length() const {
  return spec_steps > 0 ? static_cast<double>(spec_tokens) / static_cast<double>(spec_steps) : 0;
}

double Stats::mean_verify_len() const {
  int64_t n = 0, sum = 0;
  for (size_t k = 0; k < verify_len.size(); ++k) {
    n += verify_len[k];
    sum += static_cast<int64_t>(k) * verify_len[k];
  }
  return n > 0 ? static_cast<double>(sum) / static_cast<double>(n) : 0;
}

std::string Stats::summary() const {
  std::string s = "acceptance by draft position";
  for (size_t i = 0; i < verified.size(); ++i) s += str_format(" %.3f", acceptance(i));
  s += str_format(" | mean accepted length %.2f | mean verify length %.2f (steps by drafts:",
                  mean_accepted_length(),
                  mean_verify_len());
  for (size_t k = 0; k < verify_len.size(); ++k)
    s += str_format(" %zu:%lld", k, static_cast<long long>(verify_len[k]));
  s += ")";
  if (resumed > 0)
    s += str_format(" | %lld resumed", static_cast<long long>(resumed));
  return s;
}

}  // namespace dsinfer::spec
