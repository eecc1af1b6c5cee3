// zero_math.h on the GPU against the same header on the host, bit for bit:
// fp32 -> bf16 / fp16 -> fp32 on random bit patterns (NaN, infinities and
// subnormals included) and on the edges of rounding, and three AdamW and SGD
// with momentum updates of random states. The kernels are the ones a device
// context's step is built from. Exits 77 (skipped) without a CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "zero/zero_math.h"

__global__ void convert_kernel(uint16_t *bf16, uint16_t *fp16, float *bf16_back, float *fp16_back,
                               const float *src, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  bf16[i] = zero_bf16_from_f32(src[i]);
  fp16[i] = zero_fp16_from_f32(src[i]);
  bf16_back[i] = zero_bf16_to_f32(bf16[i]);
  fp16_back[i] = zero_fp16_to_f32(fp16[i]);
}

__global__ void adamw_kernel(float *p, float *m, float *v, const float *g, size_t n,
                             struct zero_adamw_coef c) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) zero_adamw_elem(&p[i], &m[i], &v[i], g[i], &c);
}

__global__ void sgd_kernel(float *p, float *m, const float *g, size_t n, float mu, float lr,
                           float wd) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) zero_sgd_elem(&p[i], &m[i], g[i], mu, lr, wd);
}

namespace {

#define CUDA_OK(call)                                                             \
  do {                                                                            \
    cudaError_t err_ = (call);                                                    \
    if (err_ != cudaSuccess) {                                                    \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
              cudaGetErrorString(err_));                                          \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float rng_uniform(uint64_t *s) { return (float)((rng_next(s) >> 40) * 0x1p-24) - 0.5f; }

template <typename T>
T *to_device(const std::vector<T> &h) {
  T *d = nullptr;
  if (cudaMalloc(&d, h.size() * sizeof(T)) != cudaSuccess) return nullptr;
  if (cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaFree(d);
    return nullptr;
  }
  return d;
}

template <typename T>
int from_device(std::vector<T> *h, const T *d) {
  CUDA_OK(cudaMemcpy(h->data(), d, h->size() * sizeof(T), cudaMemcpyDeviceToHost));
  return 0;
}

template <typename T>
size_t first_mismatch(const std::vector<T> &a, const std::vector<T> &b) {
  for (size_t i = 0; i < a.size(); i++)
    if (memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  return a.size();
}

int check_conversions(uint64_t seed) {
  const size_t n = (1u << 20) + 7;
  std::vector<float> src(n);
  uint64_t s = seed;
  for (size_t i = 0; i < n; i++) {
    uint32_t bits = (uint32_t)rng_next(&s); /* any float, NaN and infinities included */
    if (i % 2) { /* 2^-31 .. 2^16: fp16's subnormals, normals and overflow */
      uint32_t exp = (uint32_t)(rng_next(&s) % 48) + 96;
      bits = (bits & 0x807fffffu) | (exp << 23);
    }
    memcpy(&src[i], &bits, sizeof bits);
  }
  const float edges[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 5.9604645e-8f,
                         2.9802322e-8f, 3.0e38f, -3.4028235e38f};
  for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) src[e] = edges[e];
  std::vector<uint16_t> bf16(n), fp16(n);
  std::vector<float> bf16_back(n), fp16_back(n);
  for (size_t i = 0; i < n; i++) {
    bf16[i] = zero_bf16_from_f32(src[i]);
    fp16[i] = zero_fp16_from_f32(src[i]);
    bf16_back[i] = zero_bf16_to_f32(bf16[i]);
    fp16_back[i] = zero_fp16_to_f32(fp16[i]);
  }
  float *d_src = to_device(src), *d_bb = to_device(bf16_back), *d_fb = to_device(fp16_back);
  uint16_t *d_bf = to_device(bf16), *d_fp = to_device(fp16);
  if (!d_src || !d_bb || !d_fb || !d_bf || !d_fp) return fprintf(stderr, "cudaMalloc failed\n"), 1;
  CUDA_OK(cudaMemset(d_bf, 0xff, n * 2));
  CUDA_OK(cudaMemset(d_fp, 0xff, n * 2));
  CUDA_OK(cudaMemset(d_bb, 0xff, n * 4));
  CUDA_OK(cudaMemset(d_fb, 0xff, n * 4));
  convert_kernel<<<(unsigned)((n + 255) / 256), 256>>>(d_bf, d_fp, d_bb, d_fb, d_src, n);
  CUDA_OK(cudaGetLastError()); /* the launch: no kernel image for this GPU, ... */
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> g_bf(n), g_fp(n);
  std::vector<float> g_bb(n), g_fb(n);
  if (from_device(&g_bf, d_bf) || from_device(&g_fp, d_fp) || from_device(&g_bb, d_bb) ||
      from_device(&g_fb, d_fb))
    return 1;
  cudaFree(d_src), cudaFree(d_bb), cudaFree(d_fb), cudaFree(d_bf), cudaFree(d_fp);
  size_t i;
  if ((i = first_mismatch(bf16, g_bf)) < n || (i = first_mismatch(fp16, g_fp)) < n ||
      (i = first_mismatch(bf16_back, g_bb)) < n || (i = first_mismatch(fp16_back, g_fb)) < n) {
    fprintf(stderr, "FAIL: conversions differ at %zu (%a): host bf16 %04x fp16 %04x, device "
                    "bf16 %04x fp16 %04x\n", i, src[i], bf16[i], fp16[i], g_bf[i], g_fp[i]);
    return 1;
  }
  printf("ok: fp32 -> bf16 / fp16 -> fp32 of %zu values equal the host's bit for bit\n", n);
  return 0;
}

int check_optimizers(uint64_t seed) {
  const size_t n = (1u << 18) + 3;
  uint64_t s = seed;
  std::vector<float> p(n), m(n), v(n), g(n);
  for (size_t i = 0; i < n; i++) {
    p[i] = rng_uniform(&s);
    m[i] = 0.1f * rng_uniform(&s);
    v[i] = 0.01f * (rng_uniform(&s) + 0.5f);
    g[i] = rng_uniform(&s);
  }
  std::vector<float> hp = p, hm = m, hv = v, sp = p, sm = m;
  float *dp = to_device(p), *dm = to_device(m), *dv = to_device(v), *dg = to_device(g);
  float *sdp = to_device(p), *sdm = to_device(m);
  if (!dp || !dm || !dv || !dg || !sdp || !sdm) return fprintf(stderr, "cudaMalloc failed\n"), 1;
  unsigned blocks = (unsigned)((n + 255) / 256);
  for (int t = 1; t <= 3; t++) {
    double b1 = 0.9, b2 = 0.999, lr = 1e-3;
    struct zero_adamw_coef c = {(float)b1, (float)b2, (float)(lr / (1 - pow(b1, t))),
                                (float)(lr * 0.01), (float)(1.0 / sqrt(1 - pow(b2, t))), 1e-8f};
    for (size_t i = 0; i < n; i++) zero_adamw_elem(&hp[i], &hm[i], &hv[i], g[i], &c);
    adamw_kernel<<<blocks, 256>>>(dp, dm, dv, dg, n, c);
    CUDA_OK(cudaGetLastError());
    for (size_t i = 0; i < n; i++) zero_sgd_elem(&sp[i], &sm[i], g[i], 0.9f, 0.05f, 1e-4f);
    sgd_kernel<<<blocks, 256>>>(sdp, sdm, dg, n, 0.9f, 0.05f, 1e-4f);
    CUDA_OK(cudaGetLastError());
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> gp(n), gm(n), gv(n), gsp(n), gsm(n);
  if (from_device(&gp, dp) || from_device(&gm, dm) || from_device(&gv, dv) ||
      from_device(&gsp, sdp) || from_device(&gsm, sdm))
    return 1;
  cudaFree(dp), cudaFree(dm), cudaFree(dv), cudaFree(dg), cudaFree(sdp), cudaFree(sdm);
  size_t i;
  if ((i = first_mismatch(hp, gp)) < n || (i = first_mismatch(hm, gm)) < n ||
      (i = first_mismatch(hv, gv)) < n) {
    fprintf(stderr, "FAIL: AdamW differs at %zu: host p %a, device p %a\n", i, hp[i], gp[i]);
    return 1;
  }
  if ((i = first_mismatch(sp, gsp)) < n || (i = first_mismatch(sm, gsm)) < n) {
    fprintf(stderr, "FAIL: SGD differs at %zu: host p %a, device p %a\n", i, sp[i], gsp[i]);
    return 1;
  }
  printf("ok: 3 AdamW and 3 SGD-momentum updates of %zu elements equal the host's bit for bit\n",
         n);
  return 0;
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  uint64_t seed = 20261125;
  if (const char *env = getenv("WEFT_TEST_SEED")) seed = strtoull(env, nullptr, 0);
  printf("random seed %llu (set WEFT_TEST_SEED to change)\n", (unsigned long long)seed);
  return check_conversions(seed) || check_optimizers(seed + 1) ? 1 : 0;
}
