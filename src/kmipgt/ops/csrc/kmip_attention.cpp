// k-MIP attention over a batch of small graphs on the CPU, forward and backward
// (see kmipgt/ops/fused_attention.py).
//
// One task per (graph, head). The graph's keys of that head are packed into panels of 16 keys,
// dimension-major, and queries are scored 6 at a time against every panel with a 6x16 block of SIMD
// registers, accumulating over the dimension in the same order as csrc/fused_topk.cpp, so scores and
// selection are bit for bit those of the fused search. A query's score row (cache-resident) is reduced to
// its top k by (score desc, key index asc); its softmax and the weighted sum of the selected value rows
// follow at once, so no [N, H, k, d] gather exists in either pass. The rows a task reads in the
// selection's random order (values; keys, values and their gradients in the backward) are first copied
// into contiguous per-thread buffers, where they stay in cache.
// The backward is one task per (graph, head) as well: a key row only receives gradient from queries of
// its own graph and head, so each task owns the rows it writes, needs no atomics, and the sums are
// formed in the same order whatever the number of threads. Plain C ABI (no torch headers).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#ifdef __AVX__
#include <immintrin.h>
#endif

namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4)));  // a vector at any float address

constexpr int kRows = 6;    // queries per micro-kernel
constexpr int kLanes = 16;  // keys per panel (two 8-float vectors)
constexpr float kInf = std::numeric_limits<float>::infinity();

inline unsigned lane_bits(v8i mask) {
#ifdef __AVX__
  return static_cast<unsigned>(_mm256_movemask_ps(reinterpret_cast<__m256>(mask)));
#else
  unsigned bits = 0;
  for (int j = 0; j < 8; ++j) bits |= (mask[j] != 0 ? 1u : 0u) << j;
  return bits;
#endif
}

// a where mask, else b (bitwise, so that GCC and clang both take it).
inline v8f select(v8i mask, v8f a, v8f b) {
  return reinterpret_cast<v8f>((mask & reinterpret_cast<v8i>(a)) | (~mask & reinterpret_cast<v8i>(b)));
}

inline v8i select(v8i mask, v8i a, v8i b) { return (mask & a) | (~mask & b); }

// a > b ? a : b per lane, so a NaN in a never wins.
inline v8f vmax(v8f a, v8f b) {
#ifdef __AVX__
  return reinterpret_cast<v8f>(_mm256_max_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b)));
#else
  return select(a > b, a, b);
#endif
}

inline v8f load(const float* p) { return *reinterpret_cast<const v8fu*>(p); }

inline void store(float* p, v8f x) { *reinterpret_cast<v8fu*>(p) = x; }

inline float hsum(v8f x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }

inline float hmax(v8f x) {
  float m = x[0];
  for (int l = 1; l < 8; ++l) m = std::max(m, x[l]);
  return m;
}

// Lane j of the result is lane j - 1 of `cur`; lane 0 is lane 7 of `prev` (a shift by one across vectors).
template <typename V>
inline V shift_in(V prev, V cur) {
#if defined(__clang__) || __GNUC__ >= 12
  return __builtin_shufflevector(prev, cur, 7, 8, 9, 10, 11, 12, 13, 14);
#else
  return __builtin_shuffle(prev, cur, v8i{7, 8, 9, 10, 11, 12, 13, 14});
#endif
}

// exp(x) for x <= 0 (softmax logits less their maximum): Cephes' expf polynomial on x - n ln 2 times 2^n.
// x below -87.3 (where exp leaves the normal floats) and -inf give 0; NaN stays NaN.
inline v8f exp_nonpositive(v8f x) {
  const v8i under = x < -87.3f;
  x = select(under, v8f{}, x);
  const v8f magic = v8f{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const v8f n = (x * 1.44269504088896341f + magic) - magic;
  const v8f r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  v8f p = v8f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const v8f y = p * r * r + r + 1.0f;
  const v8i exponent = (__builtin_convertvector(n, v8i) + 127) << 23;
  return select(under, v8f{}, y * reinterpret_cast<v8f>(exponent));
}

// A row of n >= 8 floats whose length is not a multiple of 8 ends in the window [n - 8, n), which overlaps
// the last full vector: a vector step instead of a scalar loop (the overlapping lanes are written twice,
// with the same values). Shorter rows take scalar loops.

// Σ_j weight[j] * rows[j][p:p + 8]
inline v8f weighted_vector(const float* const* rows, const float* weight, int64_t count, int64_t p) {
  v8f a = {};
  for (int64_t j = 0; j < count; ++j) a += weight[j] * load(rows[j] + p);
  return a;
}

// out[0:n] = Σ_j weight[j] * rows[j][0:n], summed in registers (out is only written).
inline void weighted_rows(const float* const* rows, const float* weight, int64_t count, int64_t n, float* out) {
  if (n < 8) {
    for (int64_t p = 0; p < n; ++p) {
      float a = 0.0f;
      for (int64_t j = 0; j < count; ++j) a += weight[j] * rows[j][p];
      out[p] = a;
    }
    return;
  }
  int64_t p = 0;
  for (; p + 16 <= n; p += 16) {
    v8f a = {}, b = {};
    for (int64_t j = 0; j < count; ++j) {
      a += weight[j] * load(rows[j] + p);
      b += weight[j] * load(rows[j] + p + 8);
    }
    store(out + p, a);
    store(out + p + 8, b);
  }
  if (p + 8 <= n) store(out + p, weighted_vector(rows, weight, count, p));
  if (n % 8 != 0) store(out + n - 8, weighted_vector(rows, weight, count, n - 8));
}

struct Shape {
  int64_t heads, dim, dim_v, k;
};

// dst[0:n] = src[0:n] inline (a library memcpy call costs more than these few vectors).
inline void copy_row(const float* src, int64_t n, float* dst) {
  if (n < 8) {
    for (int64_t p = 0; p < n; ++p) dst[p] = src[p];
    return;
  }
  for (int64_t p = 0; p + 8 <= n; p += 8) store(dst + p, load(src + p));
  if (n % 8 != 0) store(dst + n - 8, load(src + n - 8));
}

// Rows start:start+size of one head of a [N, heads, width] tensor, as rows of `stride` >= width floats
// (the lanes beyond width are left as they are).
void gather_rows(const float* src, int64_t heads, int64_t width, int64_t head, int64_t start, int64_t size,
                 int64_t stride, float* dst) {
  for (int64_t i = 0; i < size; ++i) copy_row(src + ((start + i) * heads + head) * width, width, dst + i * stride);
}

// The inverse of gather_rows.
void scatter_rows(const float* src, int64_t stride, int64_t heads, int64_t width, int64_t head, int64_t start,
                  int64_t size, float* dst) {
  for (int64_t i = 0; i < size; ++i) copy_row(src + i * stride, width, dst + ((start + i) * heads + head) * width);
}

// Whole vectors per row: a row of width floats padded with zeros to a multiple of 8.
inline int64_t padded(int64_t width) { return (width + 7) / 8 * 8; }

// Σ a[p] b[p] over rows of `vectors` whole vectors.
inline float dot_padded(const float* a, const float* b, int64_t vectors) {
  v8f acc = {};
  for (int64_t c = 0; c < vectors; ++c) acc += load(a + 8 * c) * load(b + 8 * c);
  return hsum(acc);
}

// out += scale * x over rows of `vectors` whole vectors.
inline void axpy_padded(float scale, const float* x, int64_t vectors, float* out) {
  for (int64_t c = 0; c < vectors; ++c) store(out + 8 * c, load(out + 8 * c) + scale * load(x + 8 * c));
}

// out = Σ_j weight[j] * rows[j] over rows of `vectors` whole vectors.
inline void weighted_padded(const float* const* rows, const float* weight, int64_t count, int64_t vectors,
                            float* out) {
  for (int64_t c = 0; c < vectors; ++c) store(out + 8 * c, weighted_vector(rows, weight, count, 8 * c));
}

// Keys start:start+size of one head as panels of 16, [panel][dim][16], zero past the graph's end.
void pack_keys(const float* key, const Shape& s, int64_t head, int64_t start, int64_t size, v8f* packed) {
  const int64_t panels = (size + kLanes - 1) / kLanes;
  float* dst = reinterpret_cast<float*>(packed);
  std::memset(dst, 0, sizeof(float) * panels * s.dim * kLanes);
  for (int64_t j = 0; j < size; ++j) {
    const float* row = key + ((start + j) * s.heads + head) * s.dim;
    float* col = dst + (j / kLanes) * s.dim * kLanes + (j % kLanes);
    for (int64_t p = 0; p < s.dim; ++p) col[p * kLanes] = row[p];
  }
}

// Scores of 6 query rows against every panel, into 6 score rows of panels * 16 floats. Not inlined: on
// its own it keeps the 6 row pointers in general registers (inlined into the task, GCC moved them
// through vector registers on every step of the loop).
__attribute__((noinline)) void score_block(const float* const* q, const v8f* packed, int64_t panels, int64_t dim, v8f* const* out) {
  const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3], *q4 = q[4], *q5 = q[5];
  for (int64_t panel = 0; panel < panels; ++panel) {
    const v8f* keys = packed + panel * dim * 2;
    v8f a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {};
    v8f a30 = {}, a31 = {}, a40 = {}, a41 = {}, a50 = {}, a51 = {};
    for (int64_t p = 0; p < dim; ++p) {
      const v8f k0 = keys[2 * p], k1 = keys[2 * p + 1];
      a00 += q0[p] * k0; a01 += q0[p] * k1;
      a10 += q1[p] * k0; a11 += q1[p] * k1;
      a20 += q2[p] * k0; a21 += q2[p] * k1;
      a30 += q3[p] * k0; a31 += q3[p] * k1;
      a40 += q4[p] * k0; a41 += q4[p] * k1;
      a50 += q5[p] * k0; a51 += q5[p] * k1;
    }
    out[0][2 * panel] = a00; out[0][2 * panel + 1] = a01;
    out[1][2 * panel] = a10; out[1][2 * panel + 1] = a11;
    out[2][2 * panel] = a20; out[2][2 * panel + 1] = a21;
    out[3][2 * panel] = a30; out[3][2 * panel + 1] = a31;
    out[4][2 * panel] = a40; out[4][2 * panel + 1] = a41;
    out[5][2 * panel] = a50; out[5][2 * panel + 1] = a51;
  }
}

// Selection of the best min(k, size) scores of a row by (score desc, position asc). The row is `chunks`
// vectors, a multiple of 8, NaN past its end; NaN scores are never selected (as in the fused search), so a
// graph with NaN inputs selects fewer. Results are written best first; the functions return how many.
//
// First a lower bound on the k-th best score: the maxima of the 8 * C classes of positions p mod 8 * C
// (8 * C >= k) are distinct scores, so the k-th largest maximum is reached by at least k scores, and with
// twice as many classes as k needs, few more than k reach it (about 5.7 for k = 5 on random scores).
template <int C>
float class_bound(const v8f* scores, int64_t chunks, int64_t k) {
  v8f maxima[C];
  for (int c = 0; c < C; ++c) maxima[c] = v8f{} - kInf;
  int64_t c0 = 0;
  for (; c0 + C <= chunks; c0 += C) {
    for (int c = 0; c < C; ++c) maxima[c] = vmax(scores[c0 + c], maxima[c]);
  }
  for (int c = 0; c0 + c < chunks; ++c) maxima[c] = vmax(scores[c0 + c], maxima[c]);
  // reach[c] lane l: how many maxima are >= maxima[c][l]; the bound is the largest maximum reached k times.
  v8i reach[C] = {};
  for (int u = 0; u < C; ++u) {
    for (int l = 0; l < 8; ++l) {
      const v8f t = v8f{} + maxima[u][l];
      for (int c = 0; c < C; ++c) reach[c] -= t >= maxima[c];
    }
  }
  v8f bound = v8f{} - kInf;
  for (int c = 0; c < C; ++c) {
    bound = select((reach[c] >= static_cast<int>(k)) & (maxima[c] > bound), maxima[c], bound);
  }
  return hmax(bound);
}

// The positions of the scores >= threshold, 64 at a time: a bit mask per group of 8 vectors.
inline uint64_t reaching(const v8f* scores, float threshold) {
  uint64_t bits = 0;
  for (int u = 0; u < 8; ++u) bits |= static_cast<uint64_t>(lane_bits(scores[u] >= threshold)) << (8 * u);
  return bits;
}

// Every score >= threshold gathered in position order (at most 16 * W of them, else -1 is returned), then
// ranked all at once: a candidate's rank is the number of candidates with a higher score, or an equal
// one at a lower position. No branch depends on the scores but the loop over candidates.
template <int W>
int64_t select_ranked(const v8f* scores, int64_t chunks, int64_t k, float threshold, float* best_out,
                      int32_t* at_out) {
  constexpr int M = 2 * W, kMost = 8 * M;
  const float* row = reinterpret_cast<const float*>(scores);
  float candidate[kMost] = {};
  int32_t candidate_at[kMost] = {};
  int64_t found = 0;
  for (int64_t c = 0; c < chunks; c += 8) {
    for (uint64_t bits = reaching(scores + c, threshold); bits != 0; bits &= bits - 1) {
      const int64_t at = c * 8 + __builtin_ctzll(bits);
      const int64_t slot = std::min<int64_t>(found, kMost - 1);
      candidate[slot] = row[at];
      candidate_at[slot] = static_cast<int32_t>(at);
      ++found;
    }
  }
  if (found > kMost) return -1;
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  // Lane by lane, as the candidates were just stored one by one (see finish_query). Lanes past `found`
  // get ranks too, which nothing reads.
  v8f value[M];
  v8i rank[M] = {};
  for (int u = 0; u < M; ++u) {
    for (int l = 0; l < 8; ++l) value[u][l] = candidate[8 * u + l];
  }
  for (int64_t j = 0; j < found; ++j) {
    const v8f v = v8f{} + candidate[j];
    for (int u = 0; u < M; ++u) rank[u] -= (v > value[u]) | ((v == value[u]) & (static_cast<int>(j) < lane + 8 * u));
  }
  // Ranks past k go to slot k, which nothing reads.
  for (int64_t i = 0; i < found; ++i) {
    const int64_t slot = std::min<int64_t>(rank[i / 8][i % 8], k);
    best_out[slot] = candidate[i];
    at_out[slot] = candidate_at[i];
  }
  return std::min(found, k);
}

// One scan in position order that vector-compares 64 scores at a time with the k-th best so far (at
// least `threshold`) and inserts the few that reach it into a list kept sorted in W vector registers,
// without branches. As positions ascend, an equal score never displaces a kept one, so ties keep the
// lower position.
template <int W>
int64_t select_inserted(const v8f* scores, int64_t chunks, int64_t k, float threshold, float* best_out,
                        int32_t* at_out) {
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  const float* row = reinterpret_cast<const float*>(scores);
  // Lanes from `count` on hold -inf, so lane k - 1 is the k-th best once k are kept and -inf before.
  v8f best[W];
  v8i best_at[W];
  for (int w = 0; w < W; ++w) {
    best[w] = v8f{} - kInf;
    best_at[w] = v8i{} - 1;
  }
  int64_t count = 0;
  for (int64_t c = 0; c < chunks; c += 8) {
    for (uint64_t bits = reaching(scores + c, threshold); bits != 0; bits &= bits - 1) {
      const int64_t at = c * 8 + __builtin_ctzll(bits);
      const float v = row[at];
      if (count == k && !(v > threshold)) continue;
      // Entries that stay: the first `count` lanes holding a score >= v (a prefix); v goes after them and
      // the rest moves up one lane.
      const v8f vv = v8f{} + v;
      const v8i position = v8i{} + static_cast<int>(at);
      v8i stay[W];
      for (int w = 0; w < W; ++w) stay[w] = (lane + 8 * w < static_cast<int>(count)) & (best[w] >= vv);
      v8f moved_best[W];
      v8i moved_at[W], stay_before[W];
      for (int w = 0; w < W; ++w) {
        moved_best[w] = shift_in(w == 0 ? vv : best[w - 1], best[w]);
        moved_at[w] = shift_in(w == 0 ? position : best_at[w - 1], best_at[w]);
        stay_before[w] = shift_in(w == 0 ? v8i{} - 1 : stay[w - 1], stay[w]);
      }
      for (int w = 0; w < W; ++w) {
        best[w] = select(stay[w], best[w], select(stay_before[w], vv, moved_best[w]));
        best_at[w] = select(stay[w], best_at[w], select(stay_before[w], position, moved_at[w]));
      }
      count += count < k;
      threshold = std::max(threshold, best[(k - 1) / 8][(k - 1) % 8]);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    best_out[j] = best[j / 8][j % 8];
    at_out[j] = best_at[j / 8][j % 8];
  }
  return count;
}

// k <= 8 * W. Up to k = 16 the bound uses twice the classes and the candidates are ranked (the insertion
// takes over where unusually many reach the bound); beyond, the bound's cost grows with the square of
// its classes, so it uses k's own and the list is filled by insertion.
template <int W>
int64_t select_list(const v8f* scores, int64_t chunks, int64_t k, float* best_out, int32_t* at_out) {
  if constexpr (W <= 2) {
    const float threshold = class_bound<2 * W>(scores, chunks, k);
    const int64_t count = select_ranked<W>(scores, chunks, k, threshold, best_out, at_out);
    return count >= 0 ? count : select_inserted<W>(scores, chunks, k, threshold, best_out, at_out);
  } else {
    return select_inserted<W>(scores, chunks, k, class_bound<W>(scores, chunks, k), best_out, at_out);
  }
}

// Large k: the non-NaN positions, the k best of them chosen (a strict weak order: no NaN left) and sorted.
int64_t select_sort(const float* scores, int64_t size, int64_t k, float* best, int32_t* best_at,
                    std::vector<int32_t>& order) {
  order.clear();
  for (int64_t j = 0; j < size; ++j)
    if (!std::isnan(scores[j])) order.push_back(static_cast<int32_t>(j));
  const auto better = [scores](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  const int64_t count = std::min<int64_t>(k, static_cast<int64_t>(order.size()));
  if (count < static_cast<int64_t>(order.size()))
    std::nth_element(order.begin(), order.begin() + count, order.end(), better);
  std::sort(order.begin(), order.begin() + count, better);
  for (int64_t j = 0; j < count; ++j) {
    best_at[j] = order[j];
    best[j] = scores[order[j]];
  }
  return count;
}

// Per-thread buffers of the forward, grown to the largest graph a thread meets. best, best_at and weight
// hold k rounded up to whole vectors, and one more slot.
struct ForwardScratch {
  std::vector<v8f> packed, scores;
  std::vector<float> values, best, weight, zero_row;
  std::vector<int32_t> best_at, order;
  std::vector<const float*> rows;
};

// Up to k = 32 the vector selections above; beyond, a list in registers costs more than a selection
// (nth_element) and a sort of the winners.
int64_t select(float* scores, int64_t chunks, int64_t k, ForwardScratch& w) {
  const v8f* row = reinterpret_cast<const v8f*>(scores);
  switch ((k + 7) / 8) {
    case 1: return select_list<1>(row, chunks, k, w.best.data(), w.best_at.data());
    case 2: return select_list<2>(row, chunks, k, w.best.data(), w.best_at.data());
    case 3: return select_list<3>(row, chunks, k, w.best.data(), w.best_at.data());
    case 4: return select_list<4>(row, chunks, k, w.best.data(), w.best_at.data());
    default: return select_sort(scores, chunks * 8, k, w.best.data(), w.best_at.data(), w.order);
  }
}

struct Forward {
  const float *query, *key, *value;
  Shape s;
  float scale;
  float* out;
  int64_t* out_index;
  float* out_score;
  float* out_weight;
};

// Softmax of scale * score over a query's `count` selected keys (float32, in vectors) and the weighted sum
// of their value rows (`values`: the graph's, [size, dim_v]); the k - count slots beyond are padding.
void finish_query(const Forward& f, int64_t row, int64_t head, int64_t start, int64_t count, ForwardScratch& w) {
  const Shape& s = f.s;
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  const int64_t vectors = (s.k + 7) / 8;
  v8f top = v8f{} - kInf;
  for (int64_t c = 0; c < vectors; ++c) {
    // Lane by lane: the selection has just stored these floats one by one, and a vector load spanning
    // several recent stores waits for them to reach the cache.
    v8f best;
    for (int l = 0; l < 8; ++l) best[l] = w.best[8 * c + l];
    const v8f logit = select(lane + static_cast<int>(8 * c) < static_cast<int>(count), f.scale * best,
                             v8f{} - kInf);
    store(w.weight.data() + 8 * c, logit);
    top = vmax(logit, top);
  }
  const float largest = hmax(top);
  v8f total = {};
  for (int64_t c = 0; c < vectors; ++c) {
    const v8f e = exp_nonpositive(load(w.weight.data() + 8 * c) - largest);
    store(w.weight.data() + 8 * c, e);
    total += e;
  }
  const float sum = hsum(total);
  const int64_t slot = (row * s.heads + head) * s.k;
  for (int64_t c = 0; c < vectors; ++c) store(w.weight.data() + 8 * c, load(w.weight.data() + 8 * c) / sum);
  for (int64_t j = 0; j < count; ++j) {
    f.out_index[slot + j] = start + w.best_at[j];
    f.out_score[slot + j] = w.best[j];
    f.out_weight[slot + j] = w.weight[j];
    w.rows[j] = w.values.data() + w.best_at[j] * s.dim_v;
  }
  for (int64_t j = count; j < s.k; ++j) {
    f.out_index[slot + j] = -1;
    f.out_score[slot + j] = -kInf;
    f.out_weight[slot + j] = 0.0f;
  }
  weighted_rows(w.rows.data(), w.weight.data(), count, s.dim_v, f.out + (row * s.heads + head) * s.dim_v);
}

void forward_task(const Forward& f, int64_t head, int64_t start, int64_t size, ForwardScratch& w) {
  const Shape& s = f.s;
  const int64_t panels = (size + kLanes - 1) / kLanes, slots = (s.k + 7) / 8 * 8 + 1;
  w.packed.resize(panels * s.dim * 2);
  // Score rows of whole groups of 8 vectors (NaN past the graph), for the selection's scan.
  const int64_t chunks = (panels * 2 + 7) / 8 * 8;
  w.scores.resize(kRows * chunks);
  w.values.resize(size * s.dim_v);
  w.best.resize(slots);
  w.best_at.resize(slots);
  w.weight.resize(slots);
  w.rows.resize(s.k);
  w.zero_row.assign(s.dim, 0.0f);
  pack_keys(f.key, s, head, start, size, w.packed.data());
  gather_rows(f.value, s.heads, s.dim_v, head, start, size, s.dim_v, w.values.data());
  v8f* rows_out[kRows];
  for (int r = 0; r < kRows; ++r) rows_out[r] = w.scores.data() + r * chunks;
  for (int64_t first = 0; first < size; first += kRows) {
    const int64_t block = std::min<int64_t>(kRows, size - first);
    const float* q[kRows];
    for (int r = 0; r < kRows; ++r)
      q[r] = r < block ? f.query + ((start + first + r) * s.heads + head) * s.dim : w.zero_row.data();
    score_block(q, w.packed.data(), panels, s.dim, rows_out);
    for (int64_t r = 0; r < block; ++r) {
      float* scores = reinterpret_cast<float*>(rows_out[r]);
      std::fill(scores + size, scores + chunks * 8, std::numeric_limits<float>::quiet_NaN());
      const int64_t count = select(scores, chunks, s.k, w);
      finish_query(f, start + first + r, head, start, count, w);
    }
  }
}

struct Backward {
  const float *query, *key, *value, *grad_out;
  const int64_t* index;
  const float* weight;
  Shape s;
  float scale;
  float *grad_query, *grad_key, *grad_value;  // each nullable: not wanted
};

// Per-thread buffers of the backward: one head's rows of the graph's queries, keys, values, output
// gradients and the gradients of all three, each row zero-padded to whole vectors, so that the rows'
// loops have no tails and an update reloads exactly the vectors it stored (a load that only partly
// overlaps a recent store stalls); grad_logit and rows hold k.
struct BackwardScratch {
  std::vector<float> query, key, value, grad_out, grad_query, grad_key, grad_value, grad_logit;
  std::vector<const float*> rows;
};

// V, VV: vectors per padded row of dim and dim_v where fixed at compile time (their loops unroll), 0 where
// taken from the shape.
template <int V, int VV>
void backward_task(const Backward& b, int64_t head, int64_t start, int64_t size, BackwardScratch& w) {
  const Shape& s = b.s;
  const int64_t vd = V ? V : padded(s.dim) / 8, vdv = VV ? VV : padded(s.dim_v) / 8;
  const int64_t dim = 8 * vd, dim_v = 8 * vdv;
  // Zeroed when grown: gathers never write the padding, and updates add zero rows there.
  const auto grow = [size](std::vector<float>& buffer, int64_t width) {
    if (static_cast<int64_t>(buffer.size()) < size * width) buffer.resize(size * width, 0.0f);
  };
  grow(w.query, dim);
  grow(w.key, dim);
  grow(w.value, dim_v);
  grow(w.grad_out, dim_v);
  w.grad_query.resize(size * dim);
  w.grad_logit.resize(s.k);
  w.rows.resize(s.k);
  gather_rows(b.query, s.heads, s.dim, head, start, size, dim, w.query.data());
  gather_rows(b.key, s.heads, s.dim, head, start, size, dim, w.key.data());
  gather_rows(b.value, s.heads, s.dim_v, head, start, size, dim_v, w.value.data());
  gather_rows(b.grad_out, s.heads, s.dim_v, head, start, size, dim_v, w.grad_out.data());
  if (b.grad_key) w.grad_key.assign(size * dim, 0.0f);
  if (b.grad_value) w.grad_value.assign(size * dim_v, 0.0f);
  float* grad_logit = w.grad_logit.data();
  for (int64_t i = 0; i < size; ++i) {
    const int64_t slot = ((start + i) * s.heads + head) * s.k;
    const int64_t* index = b.index + slot;
    const float* weight = b.weight + slot;
    const float* grad_out = w.grad_out.data() + i * dim_v;
    int64_t count = 0;
    while (count < s.k && index[count] >= 0) ++count;
    if (b.grad_query || b.grad_key) {
      // grad_weight_j = grad_out · v_j; grad_logit_j = w_j (grad_weight_j - Σ w grad_weight) · scale.
      float mean = 0.0f;
      for (int64_t j = 0; j < count; ++j) {
        grad_logit[j] = dot_padded(grad_out, w.value.data() + (index[j] - start) * dim_v, vdv);
        mean += weight[j] * grad_logit[j];
      }
      for (int64_t j = 0; j < count; ++j) grad_logit[j] = weight[j] * (grad_logit[j] - mean) * b.scale;
    }
    if (b.grad_query) {
      for (int64_t j = 0; j < count; ++j) w.rows[j] = w.key.data() + (index[j] - start) * dim;
      weighted_padded(w.rows.data(), grad_logit, count, vd, w.grad_query.data() + i * dim);
    }
    if (b.grad_key) {
      const float* q = w.query.data() + i * dim;
      for (int64_t j = 0; j < count; ++j)
        axpy_padded(grad_logit[j], q, vd, w.grad_key.data() + (index[j] - start) * dim);
    }
    if (b.grad_value) {
      for (int64_t j = 0; j < count; ++j)
        axpy_padded(weight[j], grad_out, vdv, w.grad_value.data() + (index[j] - start) * dim_v);
    }
  }
  if (b.grad_query) scatter_rows(w.grad_query.data(), dim, s.heads, s.dim, head, start, size, b.grad_query);
  if (b.grad_key) scatter_rows(w.grad_key.data(), dim, s.heads, s.dim, head, start, size, b.grad_key);
  if (b.grad_value) scatter_rows(w.grad_value.data(), dim_v, s.heads, s.dim_v, head, start, size, b.grad_value);
}

using BackwardTask = void (*)(const Backward&, int64_t, int64_t, int64_t, BackwardScratch&);

// Rows of up to 4 vectors, with d == d_v, get loops of a fixed length.
BackwardTask backward_kernel(const Shape& s) {
  const int64_t vectors = padded(s.dim) / 8;
  if (padded(s.dim_v) != padded(s.dim) || vectors > 4) return backward_task<0, 0>;
  constexpr BackwardTask fixed[] = {backward_task<1, 1>, backward_task<2, 2>, backward_task<3, 3>,
                                    backward_task<4, 4>};
  return fixed[vectors - 1];
}

// 0 where ptr holds CSR offsets of num_nodes rows (starts at 0, non-decreasing, ends at num_nodes).
int check_ptr(const int64_t* ptr, int64_t num_graphs, int64_t num_nodes) {
  if (ptr[0] != 0 || ptr[num_graphs] != num_nodes) return 1;
  for (int64_t g = 0; g < num_graphs; ++g)
    if (ptr[g + 1] < ptr[g]) return 1;
  return 0;
}

constexpr int kBadPtr = 1, kNoMemory = 2;

// Runs task(head, start, size, scratch) for every (graph, head) with nodes, graph-major (a graph's heads
// share cache lines), spread over threads; each thread has its own Scratch. Returns 0 or kNoMemory.
template <typename Scratch, typename Task>
int for_each_graph_head(int64_t num_graphs, int64_t heads, const int64_t* ptr, int num_threads, Task task) {
  int status = 0;
#pragma omp parallel num_threads(num_threads)
  {
    Scratch scratch;
#pragma omp for schedule(dynamic)
    for (int64_t job = 0; job < num_graphs * heads; ++job) {
      const int64_t g = job / heads, start = ptr[g], size = ptr[g + 1] - start;
      if (size == 0) continue;
      try {
        task(job % heads, start, size, scratch);
      } catch (const std::bad_alloc&) {
#pragma omp atomic write
        status = kNoMemory;
      }
    }
  }
  return status;
}

}  // namespace

extern "C" {

// query, key: [num_nodes, heads, dim]; value: [num_nodes, heads, dim_v]; float32, contiguous. Graph g owns
// rows ptr[g]:ptr[g + 1] (ptr: [num_graphs + 1]); its queries attend to its own keys.
// out: [num_nodes, heads, dim_v]; out_index, out_score, out_weight: [num_nodes, heads, k], best first;
// slots beyond a graph's size hold -1, -inf and 0. Returns 0, 1 (bad ptr) or 2 (out of memory).
int kmip_attention_forward(const float* query, const float* key, const float* value, int64_t num_nodes,
                           int64_t heads, int64_t dim, int64_t dim_v, int64_t k, int64_t num_graphs,
                           const int64_t* ptr, float scale, float* out, int64_t* out_index, float* out_score,
                           float* out_weight, int num_threads) {
  if (check_ptr(ptr, num_graphs, num_nodes) != 0) return kBadPtr;
  const Forward f{query, key, value, Shape{heads, dim, dim_v, k}, scale, out, out_index, out_score, out_weight};
  return for_each_graph_head<ForwardScratch>(
      num_graphs, heads, ptr, num_threads,
      [&f](int64_t head, int64_t start, int64_t size, ForwardScratch& w) { forward_task(f, head, start, size, w); });
}

// The gradients of kmip_attention_forward's out w.r.t. query, key and value, from its index and weight
// and grad_out [num_nodes, heads, dim_v]; grad_query, grad_key, grad_value (shaped as query, key, value)
// are each nullable where not wanted and are overwritten. Returns 0, 1 (bad ptr) or 2 (out of memory).
int kmip_attention_backward(const float* query, const float* key, const float* value, const float* grad_out,
                            const int64_t* index, const float* weight, int64_t num_nodes, int64_t heads,
                            int64_t dim, int64_t dim_v, int64_t k, int64_t num_graphs, const int64_t* ptr,
                            float scale, float* grad_query, float* grad_key, float* grad_value,
                            int num_threads) {
  if (check_ptr(ptr, num_graphs, num_nodes) != 0) return kBadPtr;
  const Backward b{query, key, value, grad_out, index, weight, Shape{heads, dim, dim_v, k}, scale,
                   grad_query, grad_key, grad_value};
  const BackwardTask task = backward_kernel(b.s);
  return for_each_graph_head<BackwardScratch>(
      num_graphs, heads, ptr, num_threads,
      [&b, task](int64_t head, int64_t start, int64_t size, BackwardScratch& w) { task(b, head, start, size, w); });
}

}  // extern "C"
