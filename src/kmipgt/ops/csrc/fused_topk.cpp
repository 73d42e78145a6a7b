// Fused exact top-k inner-product search on the CPU (see kmipgt/ops/fused_search.py).
//
// Scores are never written to memory: a 6x16 block of query-key inner products lives in 12 SIMD
// registers (the register blocking of a GEMM micro-kernel), is compared with the current k-th best
// score of each of its 6 queries, and only the rare scores that beat it are inserted into a small
// sorted per-query list. Keys are packed per (head, graph) into panels of 16 keys, dimension-major,
// so the micro-kernel streams them with aligned vector loads; a tile of panels stays in L2 while a
// block of queries sweeps it. Each query sees its graph's keys in increasing index order and a key
// is inserted only when it is strictly better, so ties go to the lower index without extra work.
// Plain C ABI (no torch headers) so the library builds in about a second with any C++ compiler.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#ifdef __AVX__
#include <immintrin.h>
#endif

namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

constexpr int kRows = 6;      // queries per micro-kernel
constexpr int kLanes = 16;    // keys per panel (two 8-float vectors)
constexpr int kQueryBlock = 96;
constexpr int64_t kTileBytes = 192 * 1024;  // key tile kept in L2

inline bool any_lane(v8i mask) {
#ifdef __AVX__
  return _mm256_movemask_ps(reinterpret_cast<__m256>(mask)) != 0;
#else
  int acc = 0;
  for (int j = 0; j < 8; ++j) acc |= mask[j];
  return acc != 0;
#endif
}

struct TopK {
  float* value;     // [k] sorted descending
  int64_t* index;   // [k]
  int64_t count;
  float threshold;  // k-th best so far, -inf until k keys were seen

  void insert(float v, int64_t i, int64_t k) {
    int64_t j = count < k ? count++ : k - 1;
    // Strict comparison keeps earlier (lower-index) keys of equal score ahead of the new one.
    while (j > 0 && value[j - 1] < v) {
      value[j] = value[j - 1];
      index[j] = index[j - 1];
      --j;
    }
    value[j] = v;
    index[j] = i;
    if (count == k) threshold = value[k - 1];
  }
};

// Keys of one (head, graph): panels of 16 keys, [panel][dim][16], zero-padded past the graph's end.
void pack_keys(const float* key, int64_t heads, int64_t dim, int64_t head, int64_t start, int64_t size,
               float* packed) {
  const int64_t panels = (size + kLanes - 1) / kLanes;
  std::memset(packed, 0, sizeof(float) * panels * dim * kLanes);
  for (int64_t j = 0; j < size; ++j) {
    const float* row = key + ((start + j) * heads + head) * dim;
    float* dst = packed + (j / kLanes) * dim * kLanes + (j % kLanes);
    for (int64_t p = 0; p < dim; ++p) dst[p * kLanes] = row[p];
  }
}

// Scores of up to 6 queries against one panel, then insertion of those beating the thresholds.
inline void micro_kernel(const float* const* rows, const float* panel, int64_t dim, TopK* tops,
                         int64_t first_key, int valid_lanes, int64_t k) {
  v8f a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {};
  v8f a30 = {}, a31 = {}, a40 = {}, a41 = {}, a50 = {}, a51 = {};
  const float *q0 = rows[0], *q1 = rows[1], *q2 = rows[2], *q3 = rows[3], *q4 = rows[4], *q5 = rows[5];
  for (int64_t p = 0; p < dim; ++p) {
    const v8f k0 = *reinterpret_cast<const v8f*>(panel + p * kLanes);
    const v8f k1 = *reinterpret_cast<const v8f*>(panel + p * kLanes + 8);
    a00 += q0[p] * k0; a01 += q0[p] * k1;
    a10 += q1[p] * k0; a11 += q1[p] * k1;
    a20 += q2[p] * k0; a21 += q2[p] * k1;
    a30 += q3[p] * k0; a31 += q3[p] * k1;
    a40 += q4[p] * k0; a41 += q4[p] * k1;
    a50 += q5[p] * k0; a51 += q5[p] * k1;
  }
  const v8i hit = (a00 > tops[0].threshold) | (a01 > tops[0].threshold) |
                  (a10 > tops[1].threshold) | (a11 > tops[1].threshold) |
                  (a20 > tops[2].threshold) | (a21 > tops[2].threshold) |
                  (a30 > tops[3].threshold) | (a31 > tops[3].threshold) |
                  (a40 > tops[4].threshold) | (a41 > tops[4].threshold) |
                  (a50 > tops[5].threshold) | (a51 > tops[5].threshold);
  if (!any_lane(hit)) return;
  alignas(32) float s[kRows][kLanes];
  const v8f acc[kRows][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}, {a50, a51}};
  for (int r = 0; r < kRows; ++r) {
    *reinterpret_cast<v8f*>(&s[r][0]) = acc[r][0];
    *reinterpret_cast<v8f*>(&s[r][8]) = acc[r][1];
  }
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < valid_lanes; ++j)
      if (s[r][j] > tops[r].threshold) tops[r].insert(s[r][j], first_key + j, k);
}

struct Task {
  int64_t head, graph, query_start, query_end;
};

void search_block(const Task& task, const float* query, const float* packed_head, const int64_t* key_ptr,
                  const int64_t* panel_offset, int64_t heads, int64_t dim, int64_t k, const float* zero_row,
                  float* out_scores, int64_t* out_index) {
  const int64_t start = key_ptr[task.graph], size = key_ptr[task.graph + 1] - start;
  const int64_t panels = (size + kLanes - 1) / kLanes;
  const float* packed = packed_head + panel_offset[task.graph] * dim * kLanes;
  const int64_t nq = task.query_end - task.query_start;
  const int64_t slots = (nq + kRows - 1) / kRows * kRows;
  std::vector<float> values(slots * k);
  std::vector<int64_t> indices(slots * k);
  std::vector<TopK> tops(slots);
  std::vector<const float*> rows(slots);
  for (int64_t r = 0; r < slots; ++r) {
    const bool real = r < nq;
    tops[r] = TopK{values.data() + r * k, indices.data() + r * k, 0,
                   real ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity()};
    rows[r] = real ? query + ((task.query_start + r) * heads + task.head) * dim : zero_row;
  }
  const int64_t tile_panels = std::max<int64_t>(1, kTileBytes / (dim * kLanes * 4));
  for (int64_t t0 = 0; t0 < panels; t0 += tile_panels) {
    const int64_t t1 = std::min(panels, t0 + tile_panels);
    for (int64_t r = 0; r < slots; r += kRows) {
      for (int64_t p = t0; p < t1; ++p) {
        const int64_t first = p * kLanes;
        const int valid = static_cast<int>(std::min<int64_t>(kLanes, size - first));
        micro_kernel(&rows[r], packed + p * dim * kLanes, dim, &tops[r], start + first, valid, k);
      }
    }
  }
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t out = ((task.query_start + r) * heads + task.head) * k;
    for (int64_t j = 0; j < tops[r].count; ++j) {
      out_scores[out + j] = tops[r].value[j];
      out_index[out + j] = tops[r].index[j];
    }
  }
}

}  // namespace

extern "C" {

// query: [n_query, heads, dim], key: [n_key, heads, dim], float32 contiguous. The queries of segment g,
// rows query_ptr[g]:query_ptr[g+1], search the keys key_ptr[g]:key_ptr[g+1] (CSR offsets, num_segments + 1).
// out_scores/out_index: [n_query, heads, k], pre-filled with -inf / -1 by the caller; indices are key rows.
// Returns 0 on success, 1 when memory for the packed keys could not be allocated.
int kmip_fused_topk(const float* query, const float* key, int64_t heads, int64_t dim, int64_t k,
                    const int64_t* query_ptr, const int64_t* key_ptr, int64_t num_segments, float* out_scores,
                    int64_t* out_index, int num_threads) {
  std::vector<int64_t> panel_offset(num_segments + 1, 0);
  for (int64_t g = 0; g < num_segments; ++g)
    panel_offset[g + 1] = panel_offset[g] + (key_ptr[g + 1] - key_ptr[g] + kLanes - 1) / kLanes;
  const int64_t head_floats = panel_offset[num_segments] * dim * kLanes;
  const size_t bytes = ((sizeof(float) * head_floats * heads + 63) / 64 + 1) * 64;
  float* packed = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (packed == nullptr) return 1;
  std::vector<Task> tasks;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t g = 0; g < num_segments; ++g)
      for (int64_t q = query_ptr[g]; q < query_ptr[g + 1]; q += kQueryBlock)
        if (key_ptr[g + 1] > key_ptr[g]) tasks.push_back(Task{h, g, q, std::min(q + kQueryBlock, query_ptr[g + 1])});
  std::vector<float> zero_row(dim, 0.0f);
  const int64_t pack_jobs = heads * num_segments;
#pragma omp parallel num_threads(num_threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < pack_jobs; ++job) {
      const int64_t h = job / num_segments, g = job % num_segments;
      pack_keys(key, heads, dim, h, key_ptr[g], key_ptr[g + 1] - key_ptr[g],
                packed + h * head_floats + panel_offset[g] * dim * kLanes);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < static_cast<int64_t>(tasks.size()); ++t) {
      search_block(tasks[t], query, packed + tasks[t].head * head_floats, key_ptr, panel_offset.data(), heads,
                   dim, k, zero_row.data(), out_scores, out_index);
    }
  }
  std::free(packed);
  return 0;
}

}  // extern "C"
