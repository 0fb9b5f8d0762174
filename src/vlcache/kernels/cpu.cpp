// vlcache's CPU kernels (fp32), built on first use by vlcache/kernels/__init__.py.
//
// attention: causal attention of query rows at given positions over keys [0, key_end), the
//   query heads that share a key/value head stacked into one matrix, so that each block's two
//   products are single GEMMs of 7x more rows than a per-head kernel runs (Qwen2.5's 14 query
//   heads on 2 KV heads); online softmax over key blocks (flash attention's recurrence).
// silu_mul: silu(gate + bias) * (up + bias) in one pass (the gated MLP's activation).
// mkl_pack / mkl_linear: a linear layer's weight packed once into MKL's internal layout
//   (cblas_sgemm_pack), then x W^T + b from it (cblas_sgemm_compute): no per-call packing of
//   the weight, which plain sgemm redoes on every call.
#if defined(__AVX512F__)
#define CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY AVX512
#elif defined(__AVX2__)
#define CPU_CAPABILITY_AVX2
#define CPU_CAPABILITY AVX2
#endif
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

// BLAS's sgemm (column-major), exported by libtorch_cpu (MKL inside PyTorch's CPU wheels).
extern "C" void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b,
                       const int* ldb, const float* beta, float* c, const int* ldc);

// MKL's packed GEMM (CBLAS, LP64 ints), weak: a BLAS without it leaves them null, and
// mkl_packing() says so instead of the module failing to load.
extern "C" {
__attribute__((weak)) size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
__attribute__((weak)) void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n,
                                            int k, float alpha, const float* src, int ld,
                                            float* dest);
__attribute__((weak)) void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n,
                                               int k, const float* a, int lda, const float* b,
                                               int ldb, float beta, float* c, int ldc);
}
namespace cblas {  // the CBLAS enum values MKL's headers give
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
}

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// row-major C[m x n] (row stride ldc) = A[m x k] (lda) * op(B) + beta C, where op(B) is B[k x n]
// (ldb), or with b_rows_are_columns B^T given as [n x k] (ldb).
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, bool b_rows_are_columns, float beta, float* c, int64_t ldc) {
  // row-major C = A op(B)  <=>  column-major C^T = op(B)^T A^T
  const char tb = b_rows_are_columns ? 'T' : 'N', ta = 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  const int ilb = static_cast<int>(ldb), ila = static_cast<int>(lda), ilc = static_cast<int>(ldc);
  const float one = 1.f;
  sgemm_(&tb, &ta, &im, &in, &ik, &one, b, &ilb, a, &ila, &beta, c, &ilc);
}

// s[0, valid) <- exp(s - m) with m = max(prev, max s[0, valid)), s[valid, cols) <- 0;
// returns (m, sum of the exps).
std::pair<float, float> exp_row(float* s, int64_t valid, int64_t cols, float prev) {
  float top = prev;
  if (valid > 0)
    top = std::max(top, at::vec::reduce_all<float>(
                            [](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, s, valid));
  const Vec vtop(top);
  Vec vsum(0.f);
  int64_t c = 0;
  for (; c + Vec::size() <= valid; c += Vec::size()) {
    const Vec e = (Vec::loadu(s + c) - vtop).exp_u20();
    e.store(s + c);
    vsum = vsum + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, vsum);
  for (; c < valid; ++c) {
    s[c] = std::exp(s[c] - top);
    sum += s[c];
  }
  std::fill(s + std::max<int64_t>(valid, 0), s + cols, 0.f);
  return {top, sum};
}

}  // namespace

// q [n, nh, d], k/v [>= key_end, kvh, d] (last dim contiguous); query row i sits at position
// positions[i] (sorted; or first + i when positions is empty) and sees keys j <= its position,
// j < key_end. Returns [n, nh, d].
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& positions, int64_t first, int64_t key_end,
                        double scale, int64_t block_q, int64_t block_k) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be [len, heads, d]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "the head dimension must be contiguous");
  const int64_t n = q.size(0), nh = q.size(1), d = q.size(2), kvh = k.size(1);
  TORCH_CHECK(nh % kvh == 0 && k.size(2) == d && v.size(2) == d && v.size(1) == kvh);
  TORCH_CHECK(key_end <= k.size(0) && key_end <= v.size(0), "key_end beyond the keys");
  const bool listed = positions.defined() && positions.numel() > 0;
  TORCH_CHECK(!listed || (positions.scalar_type() == at::kLong && positions.numel() == n &&
                          positions.is_contiguous()), "positions: [n] int64, contiguous");
  const int64_t* pp = listed ? positions.data_ptr<int64_t>() : nullptr;
  auto pos = [&](int64_t i) { return pp ? pp[i] : first + i; };
  const int64_t g = nh / kvh;
  auto out = torch::empty({n, nh, d}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t blocks = (n + block_q - 1) / block_q;
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, kvh * blocks, 1, [&](int64_t t0, int64_t t1) {
    const int64_t most = g * block_q;  // stacked rows: (head j, row i) -> j * rows + i
    std::vector<float> Q(most * d), S(most * block_k), O(most * d), top(most), sum(most);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / blocks, r0 = (t % blocks) * block_q;
      const int64_t rows = std::min(block_q, n - r0), m = g * rows;
      int64_t lo = pos(r0), hi = pos(r0);
      for (int64_t i = 0; i < rows; ++i) {
        lo = std::min(lo, pos(r0 + i));
        hi = std::max(hi, pos(r0 + i));
      }
      for (int64_t j = 0; j < g; ++j)
        for (int64_t i = 0; i < rows; ++i) {
          const float* src = qp + (r0 + i) * q.stride(0) + (h * g + j) * q.stride(1);
          at::vec::map([sc](Vec x) { return x * Vec(sc); }, Q.data() + (j * rows + i) * d, src, d);
        }
      std::fill(O.begin(), O.begin() + m * d, 0.f);
      std::fill(top.begin(), top.begin() + m, kNegInf);
      std::fill(sum.begin(), sum.begin() + m, 0.f);
      const int64_t end = std::min(key_end, hi + 1);
      for (int64_t c0 = 0; c0 < end; c0 += block_k) {
        const int64_t cols = std::min(block_k, end - c0);
        gemm(m, cols, d, Q.data(), d, kp + c0 * k.stride(0) + h * k.stride(1), k.stride(0),
             true, 0.f, S.data(), block_k);  // S = Q K^T
        const bool cut = c0 + cols > lo + 1;  // some row sees only part of this block
        for (int64_t r = 0; r < m; ++r) {
          const int64_t valid =
              cut ? std::clamp<int64_t>(pos(r0 + r % rows) + 1 - c0, 0, cols) : cols;
          const auto [now, add] = exp_row(S.data() + r * block_k, valid, cols, top[r]);
          const float keep = top[r] == kNegInf ? 0.f : std::exp(top[r] - now);
          if (keep != 1.f) {
            float* o = O.data() + r * d;
            at::vec::map([keep](Vec x) { return x * Vec(keep); }, o, o, d);
          }
          sum[r] = sum[r] * keep + add;
          top[r] = now;
        }
        gemm(m, d, cols, S.data(), block_k, vp + c0 * v.stride(0) + h * v.stride(1),
             v.stride(0), false, 1.f, O.data(), d);  // O += P V
      }
      for (int64_t j = 0; j < g; ++j)
        for (int64_t i = 0; i < rows; ++i) {
          const float inv = 1.f / sum[j * rows + i];
          at::vec::map([inv](Vec x) { return x * Vec(inv); },
                       op + ((r0 + i) * nh + h * g + j) * d, O.data() + (j * rows + i) * d, d);
        }
    }
  });
  return out;
}

// out[r, c] = silu(gate[r, c] + gate_bias[c]) * (up[r, c] + up_bias[c]) (each bias optional);
// rows may be strided, columns contiguous; out may be gate itself.
void silu_mul(const torch::Tensor& gate, const torch::Tensor& up, torch::Tensor& out,
              const std::optional<torch::Tensor>& gate_bias,
              const std::optional<torch::Tensor>& up_bias) {
  TORCH_CHECK(gate.dim() == 2 && up.sizes() == gate.sizes() && out.sizes() == gate.sizes());
  TORCH_CHECK(gate.scalar_type() == at::kFloat && up.scalar_type() == at::kFloat &&
              out.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(gate.stride(1) == 1 && up.stride(1) == 1 && out.stride(1) == 1);
  const int64_t rows = gate.size(0), cols = gate.size(1);
  auto bias = [cols](const std::optional<torch::Tensor>& b) -> const float* {
    if (!b.has_value() || !b->defined()) return nullptr;
    TORCH_CHECK(b->scalar_type() == at::kFloat && b->dim() == 1 && b->size(0) == cols &&
                b->stride(0) == 1, "a bias must be [cols] float32, contiguous");
    return b->data_ptr<float>();
  };
  const float *gb = bias(gate_bias), *ub = bias(up_bias);
  const float *gp = gate.data_ptr<float>(), *upp = up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t gs = gate.stride(0), us = up.stride(0), os = out.stride(0);
  auto one = [gb, ub](const float* g, const float* u, float* o, int64_t c, int64_t n) {
    Vec x = Vec::loadu(g + c, n), y = Vec::loadu(u + c, n);
    if (gb) x = x + Vec::loadu(gb + c, n);
    if (ub) y = y + Vec::loadu(ub + c, n);
    (x / (Vec(1.f) + x.neg().exp()) * y).store(o + c, n);
  };
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *g = gp + r * gs, *u = upp + r * us;
      float* o = op + r * os;
      int64_t c = 0;
      for (; c + Vec::size() <= cols; c += Vec::size()) one(g, u, o, c, Vec::size());
      if (c < cols) one(g, u, o, c, cols - c);
    }
  });
}

bool mkl_packing() {
  return cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr &&
         cblas_sgemm_compute != nullptr;
}

// weight [n, k] (nn.Linear's layout), packed for products with `rows_hint` input rows (MKL
// picks its blocking by it; any row count may use the result) -> an opaque float32 buffer that
// must stay where it is (MKL's layout depends on its address's alignment: never copy it).
// The buffer is its own anonymous mapping: MKL asks for several times the bytes of a small
// weight but writes about the weight's size, and pages never written are never resident (from the heap,
// reused pages would be).
torch::Tensor mkl_pack(const torch::Tensor& weight, int64_t rows_hint) {
  TORCH_CHECK(mkl_packing(), "this BLAS has no cblas_sgemm_pack");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "the weight must be [n, k] float32, contiguous");
  const int n = weight.size(0), k = weight.size(1), m = std::max<int64_t>(rows_hint, 1);
  const size_t bytes = cblas_sgemm_pack_get_size(cblas::kBMatrix, m, n, k);
  void* buffer = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(buffer != MAP_FAILED, "mkl_pack: cannot map ", bytes, " bytes");
  auto packed = torch::from_blob(buffer, {static_cast<int64_t>(bytes / sizeof(float))},
                                 [bytes](void* p) { munmap(p, bytes); }, weight.options());
  cblas_sgemm_pack(cblas::kRowMajor, cblas::kBMatrix, cblas::kTrans, m, n, k, 1.f,
                   weight.data_ptr<float>(), k, packed.data_ptr<float>());
  return packed;
}

// x [m, k] contiguous, `packed` from mkl_pack of an [n, k] weight -> x W^T + bias, [m, n].
torch::Tensor mkl_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t n,
                         const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(mkl_packing(), "this BLAS has no cblas_sgemm_compute");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be [rows, k] float32, contiguous");
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 1, "not an mkl_pack buffer");
  const int m = x.size(0), k = x.size(1);
  auto out = torch::empty({m, n}, x.options());
  float beta = 0.f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n,
                "the bias must be [n] float32");
    out.copy_(bias->expand({m, n}));  // C = bias, then C += x W^T (never a view of the bias)
    beta = 1.f;
  }
  if (m > 0)
    cblas_sgemm_compute(cblas::kRowMajor, cblas::kNoTrans, cblas::kPacked, m, n, k,
                        x.data_ptr<float>(), k, packed.data_ptr<float>(), k, beta,
                        out.data_ptr<float>(), n);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mkl_packing", &mkl_packing);
  m.def("mkl_pack", &mkl_pack, py::arg("weight"), py::arg("rows_hint"));
  m.def("mkl_linear", &mkl_linear, py::arg("x"), py::arg("packed"), py::arg("n"),
        py::arg("bias") = py::none());
  m.def("attention", &attention);
  m.def("silu_mul", &silu_mul, py::arg("gate"), py::arg("up"), py::arg("out"),
        py::arg("gate_bias") = py::none(), py::arg("up_bias") = py::none());
}
