// Chi-square goodness of fit for the speculative-decoding distribution tests (V4 MTP, V4.1
// DSpark): observed counts of token sequences against their exact probabilities.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace dsinfer::testing_util {

// The chi-square statistic of observed counts against expected probabilities, merging the
// categories expected fewer than 5 times into one. *dof: the degrees of freedom.
inline double chi_square(const std::map<std::vector<int32_t>, int>& observed,
                         const std::map<std::vector<int32_t>, double>& expected,
                         int n,
                         int* dof) {
  double stat = 0, rest_o = 0, rest_e = 0;
  int cells = 0;
  for (const auto& [key, p] : expected) {
    auto it = observed.find(key);
    const double o = it == observed.end() ? 0 : it->second;
    const double e = p * n;
    if (e < 5) {
      rest_o += o;
      rest_e += e;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  for (const auto& [key, o] : observed) {
    if (!expected.count(key))
      rest_o += o;  // a sequence the model cannot produce
  }
  if (rest_e > 0 || rest_o > 0) {
    stat += (rest_o - rest_e) * (rest_o - rest_e) / std::max(rest_e, 1e-9);
    ++cells;
  }
  *dof = cells - 1;
  return stat;
}

// The 99.9% quantile of chi-square with dof degrees of freedom (Wilson-Hilferty approximation).
inline double chi_square_limit_999(int dof) {
  const double z = 3.09, h = 2.0 / (9.0 * dof);
  return dof * std::pow(1 - h + z * std::sqrt(h), 3);
}

}  // namespace dsinfer::testing_util
