// Fused exact top-k inner-product search on the CPU (see kmipgt/ops/fused_search.py).
//
// Scores are never written to memory: a 6x16 block of query-key inner products lives in 12 SIMD
// registers (the register blocking of a GEMM micro-kernel), is compared with the current k-th best
// score of each of its 6 queries, and only the rare scores that beat it are inserted into a small
// per-query list (a heap for large k). Keys are packed per (head, segment) into panels of 16 keys,
// dimension-major, so the micro-kernel streams them with aligned vector loads; a tile of panels stays
// in L2 while the queries that probe the segment sweep it. A segment is a graph (exact search: each
// query probes its own graph) or an inverted list (IVF: each query probes nprobe lists); one kernel
// serves both.
// Ordering is by (score descending, key id ascending), so ties go to the lower id whatever order the
// segments are visited in. Plain C ABI (no torch headers): builds in about a second.

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
constexpr int64_t kTileBytes = 192 * 1024;  // key tile kept in L2

// Bit j set where lane j of the mask is set.
inline unsigned lane_bits(v8i mask) {
#ifdef __AVX__
  return static_cast<unsigned>(_mm256_movemask_ps(reinterpret_cast<__m256>(mask)));
#else
  unsigned bits = 0;
  for (int j = 0; j < 8; ++j) bits |= (mask[j] != 0 ? 1u : 0u) << j;
  return bits;
#endif
}

// Above this k a query's best keys are kept in a heap, below it in a sorted list (measured crossover,
// docs/search.md: the two tie at k = 256; the list is 25-45 % faster at k = 64-128, where its short,
// predictable shifts beat the heap's branchy sifts, and 2.5x slower at k = 1,024).
constexpr int64_t kHeapAbove = 256;

// A query's k best keys so far: a list sorted by (score desc, id asc) for small k, a binary heap whose
// root is the worst kept key (lowest score, then highest id) for large k. A sorted list shifts up to k
// entries per insertion and the first k keys all insert, so k in the thousands cost more than the
// scores; a heap insertion costs O(log k).
struct TopK {
  float* value;      // [k]: sorted, or a heap until finish() sorts it
  int64_t* index;    // [k]
  int64_t count;
  float threshold;   // k-th best score so far; -inf until k keys were seen
  int64_t threshold_id;
  bool heap;

  static bool worse(float va, int64_t ia, float vb, int64_t ib) { return va < vb || (va == vb && ia > ib); }

  bool beats(float v, int64_t id) const { return worse(threshold, threshold_id, v, id); }

  void insert(float v, int64_t id, int64_t k) {
    if (!heap) {
      insert_sorted(v, id, k);
    } else if (count < k) {
      sift_up(count++, v, id);
    } else {
      sift_down(0, count, v, id);
    }
    if (count == k) {
      const int64_t worst = heap ? 0 : k - 1;
      threshold = value[worst];
      threshold_id = index[worst];
    }
  }

  void insert_sorted(float v, int64_t id, int64_t k) {
    int64_t j = count < k ? count++ : k - 1;
    while (j > 0 && worse(value[j - 1], index[j - 1], v, id)) {
      value[j] = value[j - 1];
      index[j] = index[j - 1];
      --j;
    }
    value[j] = v;
    index[j] = id;
  }

  // Puts (v, id) at slot j of a heap of j + 1 entries, moving worse-than-it parents aside.
  void sift_up(int64_t j, float v, int64_t id) {
    while (j > 0) {
      const int64_t parent = (j - 1) / 2;
      if (!worse(v, id, value[parent], index[parent])) break;
      value[j] = value[parent];
      index[j] = index[parent];
      j = parent;
    }
    value[j] = v;
    index[j] = id;
  }

  // Puts (v, id) at slot j of a heap of n entries (replacing what was there), moving worse children up.
  void sift_down(int64_t j, int64_t n, float v, int64_t id) {
    for (int64_t child = 2 * j + 1; child < n; child = 2 * j + 1) {
      if (child + 1 < n && worse(value[child + 1], index[child + 1], value[child], index[child])) ++child;
      if (!worse(value[child], index[child], v, id)) break;
      value[j] = value[child];
      index[j] = index[child];
      j = child;
    }
    value[j] = v;
    index[j] = id;
  }

  // Heap sort in place: the worst entry goes last, so the list ends best first.
  void finish() {
    if (!heap) return;
    for (int64_t n = count - 1; n > 0; --n) {
      const float v = value[n];
      const int64_t id = index[n];
      value[n] = value[0];
      index[n] = index[0];
      sift_down(0, n, v, id);
    }
  }
};

// Keys of one (head, segment): panels of 16 keys, [panel][dim][16], zero-padded past the segment's end.
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

// Scores of 6 queries against one panel, then insertion of those that beat a query's k-th best.
// The vector test uses >= so an equal score with a lower id (possible when segments are visited
// out of id order) reaches the exact scalar test. A row's threshold only rises while its own hits are
// inserted, so testing all 16 lanes against the threshold before the insertions is safe.
inline void micro_kernel(const float* const* rows, const float* panel, int64_t dim, TopK* const* tops,
                         const int64_t* ids, int valid_lanes, int64_t k) {
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
  // One bit per (row, key) whose score reaches the row's threshold; the lanes past the segment's end
  // are masked off. Only those scores are looked at again, so the cost of the rare insertions is
  // proportional to their number.
  const float t0 = tops[0]->threshold, t1 = tops[1]->threshold, t2 = tops[2]->threshold;
  const float t3 = tops[3]->threshold, t4 = tops[4]->threshold, t5 = tops[5]->threshold;
  const v8i m00 = a00 >= t0, m01 = a01 >= t0, m10 = a10 >= t1, m11 = a11 >= t1, m20 = a20 >= t2;
  const v8i m21 = a21 >= t2, m30 = a30 >= t3, m31 = a31 >= t3, m40 = a40 >= t4, m41 = a41 >= t4;
  const v8i m50 = a50 >= t5, m51 = a51 >= t5;
  // The common case: no score of the block reaches its row's threshold.
  if (lane_bits(m00 | m01 | m10 | m11 | m20 | m21 | m30 | m31 | m40 | m41 | m50 | m51) == 0) return;
  const unsigned valid = valid_lanes == kLanes ? 0xFFFFu : (1u << valid_lanes) - 1u;
  const v8f acc[kRows][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}, {a50, a51}};
  const v8i hit[kRows][2] = {{m00, m01}, {m10, m11}, {m20, m21}, {m30, m31}, {m40, m41}, {m50, m51}};
  for (int r = 0; r < kRows; ++r) {
    unsigned bits = (lane_bits(hit[r][0]) | (lane_bits(hit[r][1]) << 8)) & valid;
    while (bits != 0) {
      const int j = __builtin_ctz(bits);
      bits &= bits - 1;
      const float score = acc[r][j >> 3][j & 7];
      if (tops[r]->beats(score, ids[j])) tops[r]->insert(score, ids[j], k);
    }
  }
}

struct Problem {
  const float* query;
  const float* packed;  // [heads][panels][dim][16]
  int64_t heads, dim, k, num_segments, head_floats;
  const int64_t* key_ptr;
  const int64_t* key_ids;  // id reported for each key row; nullptr = the row itself
  const int64_t* panel_offset;
  const int64_t* probe_ptr;
  const int64_t* probe_query;
  float* out_scores;
  int64_t* out_index;
};

// All probes of queries [first, last) of one head: segment by segment, keys tile by tile.
void search_range(const Problem& pb, int64_t head, int64_t first, int64_t last) {
  const int64_t span = last - first, k = pb.k, dim = pb.dim;
  std::vector<float> values(span * k);
  std::vector<int64_t> indices(span * k);
  std::vector<TopK> tops(span + 1);
  constexpr float inf = std::numeric_limits<float>::infinity();
  // Start from the caller's lists (-inf / -1 where empty), so a search can continue an earlier one.
  for (int64_t r = 0; r < span; ++r) {
    const int64_t in = ((first + r) * pb.heads + head) * k;
    TopK& top = tops[r];
    top = TopK{values.data() + r * k, indices.data() + r * k, 0, -inf, std::numeric_limits<int64_t>::max(),
               k > kHeapAbove};
    for (int64_t j = 0; j < k && pb.out_index[in + j] >= 0; ++j)
      top.insert(pb.out_scores[in + j], pb.out_index[in + j], k);
  }
  tops[span] = TopK{nullptr, nullptr, 0, inf, -1, false};  // padding row: never inserts
  std::vector<float> zero_row(dim, 0.0f);
  std::vector<int64_t> lane_ids(kLanes);
  const int64_t tile_panels = std::max<int64_t>(1, kTileBytes / (dim * kLanes * 4));
  const float* packed_head = pb.packed + head * pb.head_floats;
  for (int64_t s = 0; s < pb.num_segments; ++s) {
    const int64_t start = pb.key_ptr[s], size = pb.key_ptr[s + 1] - start;
    const int64_t* probes_begin = pb.probe_query + pb.probe_ptr[s];
    const int64_t* probes_end = pb.probe_query + pb.probe_ptr[s + 1];
    const int64_t* lo = std::lower_bound(probes_begin, probes_end, first);
    const int64_t* hi = std::lower_bound(lo, probes_end, last);
    if (size == 0 || lo == hi) continue;
    const int64_t panels = (size + kLanes - 1) / kLanes;
    const float* packed = packed_head + pb.panel_offset[s] * dim * kLanes;
    for (int64_t t0 = 0; t0 < panels; t0 += tile_panels) {
      const int64_t t1 = std::min(panels, t0 + tile_panels);
      for (const int64_t* q = lo; q < hi; q += kRows) {
        const float* rows[kRows];
        TopK* row_tops[kRows];
        for (int r = 0; r < kRows; ++r) {
          const bool real = q + r < hi;
          rows[r] = real ? pb.query + (q[r] * pb.heads + head) * dim : zero_row.data();
          row_tops[r] = real ? &tops[q[r] - first] : &tops[span];
        }
        for (int64_t p = t0; p < t1; ++p) {
          const int64_t row0 = start + p * kLanes;
          const int valid = static_cast<int>(std::min<int64_t>(kLanes, size - p * kLanes));
          for (int j = 0; j < valid; ++j) lane_ids[j] = pb.key_ids ? pb.key_ids[row0 + j] : row0 + j;
          micro_kernel(rows, packed + p * dim * kLanes, dim, row_tops, lane_ids.data(), valid, k);
        }
      }
    }
  }
  for (int64_t r = 0; r < span; ++r) {
    const int64_t out = ((first + r) * pb.heads + head) * k;
    tops[r].finish();
    for (int64_t j = 0; j < tops[r].count; ++j) {
      pb.out_scores[out + j] = tops[r].value[j];
      pb.out_index[out + j] = tops[r].index[j];
    }
  }
}

}  // namespace

extern "C" {

// query: [num_queries, heads, dim], key: [num_keys, heads, dim], float32 contiguous.
// Segment s holds key rows key_ptr[s]:key_ptr[s+1] (CSR offsets, num_segments + 1). The queries that
// probe it are probe_query[probe_ptr[s]:probe_ptr[s+1]], ascending. key_ids (nullable): the id reported
// and tie-broken on for each key row. Queries are processed in blocks of query_block per thread task.
// out_scores/out_index: [num_queries, heads, k], in: each query's current top-k, sorted by (score desc,
// id asc), -inf / -1 where empty (a fresh search passes them all empty); out: the updated top-k.
// Returns 0 on success, 1 when memory for the packed keys could not be allocated.
int kmip_topk_search(const float* query, const float* key, int64_t num_queries, int64_t heads, int64_t dim,
                     int64_t k, int64_t num_segments, const int64_t* key_ptr, const int64_t* key_ids,
                     const int64_t* probe_ptr, const int64_t* probe_query, int64_t query_block,
                     float* out_scores, int64_t* out_index, int num_threads) {
  std::vector<int64_t> panel_offset(num_segments + 1, 0);
  for (int64_t s = 0; s < num_segments; ++s)
    panel_offset[s + 1] = panel_offset[s] + (key_ptr[s + 1] - key_ptr[s] + kLanes - 1) / kLanes;
  const int64_t head_floats = panel_offset[num_segments] * dim * kLanes;
  const size_t bytes = ((sizeof(float) * head_floats * heads + 63) / 64 + 1) * 64;
  float* packed = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (packed == nullptr) return 1;
  const Problem pb{query,     packed,        heads,        dim,         k,          num_segments, head_floats,
                   key_ptr,   key_ids,       panel_offset.data(), probe_ptr, probe_query, out_scores, out_index};
  const int64_t pack_jobs = heads * num_segments;
  const int64_t blocks = (num_queries + query_block - 1) / query_block;
#pragma omp parallel num_threads(num_threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < pack_jobs; ++job) {
      const int64_t h = job / num_segments, s = job % num_segments;
      pack_keys(key, heads, dim, h, key_ptr[s], key_ptr[s + 1] - key_ptr[s],
                packed + h * head_floats + panel_offset[s] * dim * kLanes);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < heads * blocks; ++task) {
      const int64_t h = task / blocks, first = (task % blocks) * query_block;
      search_range(pb, h, first, std::min(num_queries, first + query_block));
    }
  }
  std::free(packed);
  return 0;
}

// Counting sort of the (query, list) probe pairs by list: probes [num_queries, nprobe] of list ids in
// [0, num_segments). Writes probe_ptr [num_segments + 1] and probe_query [num_queries * nprobe], each
// list's queries ascending (a comparison sort of the pairs costs far more than the search here).
void kmip_group_probes(const int64_t* probes, int64_t num_queries, int64_t nprobe, int64_t num_segments,
                       int64_t* probe_ptr, int64_t* probe_query) {
  std::fill(probe_ptr, probe_ptr + num_segments + 1, 0);
  for (int64_t i = 0; i < num_queries * nprobe; ++i) ++probe_ptr[probes[i] + 1];
  for (int64_t s = 0; s < num_segments; ++s) probe_ptr[s + 1] += probe_ptr[s];
  std::vector<int64_t> cursor(probe_ptr, probe_ptr + num_segments);
  for (int64_t q = 0; q < num_queries; ++q)
    for (int64_t j = 0; j < nprobe; ++j) probe_query[cursor[probes[q * nprobe + j]]++] = q;
}

}  // extern "C"
