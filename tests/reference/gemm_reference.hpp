// Plain GEMM reference in double precision (shares no code with the engine).
// Also returns, per element, the magnitude |alpha| * sum|a||b| + |beta * c|
// that bounds the rounding error of any float evaluation.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace kvhead::reference {

struct gemm_result {
  std::vector<double> value;
  std::vector<double> magnitude;
};

// op(A)(i, p) = trans_a ? a[p*lda + i] : a[i*lda + p]; op(B)(p, j) likewise.
inline gemm_result gemm(std::size_t m, std::size_t n, std::size_t k, double alpha, const float* a, std::size_t lda,
                        bool trans_a, const float* b, std::size_t ldb, bool trans_b, double beta, const float* c,
                        std::size_t ldc) {
  gemm_result result{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (std::size_t p = 0; p < k; ++p) {
        const double x = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double y = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      const double old_c = beta == 0.0 ? 0.0 : beta * double(c[i * ldc + j]);
      result.value[i * n + j] = alpha * sum + old_c;
      result.magnitude[i * n + j] = std::fabs(alpha) * magnitude + std::fabs(old_c);
    }
  }
  return result;
}

}  // namespace kvhead::reference
