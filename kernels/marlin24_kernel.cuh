// FP16 x INT4 GEMM on the Sparse-MARLIN 2:4 layout: C (m, n) = A (m, k) @ dequant24(B), fp32 accumulation, fp16
// output, on the sparse tensor cores (mma.sp m16n8k32).
//
// Written for this project from DESIGN.md 3.2 / 5 and the PTX ISA's description of mma.sp; the layout's executable
// definition is marlin_cli/formats/marlin24.py. Build: nvcc -std=c++17 -O3
//   -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 -c kernels/marlin24.cu
//
// The product is computed transposed, C^T = W^T A^T: the 2:4 weights are mma.sp's sparse operand A (16 output
// columns x 32 along K, stored as 16 x 16 kept values + metadata) and 8 rows of activations its dense operand B.
// - A warp owns 128 output columns. Lane (g, t) (g = lane / 4, t = lane % 4) loads the 16-byte chunks 8g + t and
//   8g + 4 + t of the columns' packed k32 row: columns 16g + 0..7 and 16g + 8..15 at the compressed K rows of its
//   fragment (2t, 2t + 1, 2t + 8, 2t + 9). Word j of the two chunks gives rows 16g + j + 4p (chunk 1) and
//   16g + 8 + j + 4p (chunk 2) for p = 0, 1: the rows g and g + 8 of mma tile (j, p), 8 tiles per k32 row.
// - Metadata: tile (j, p) needs, in threads 2p, 2p + 1 of group g (sparsity selector p), the words of rows
//   16g + j + 4p and + 8 for K 0..15 / 16..31: the packed word 32 (g / 2) + 4 (j + 4p) + 2 (g % 2) + t % 2 of the
//   warp's 128 columns (marlin24.meta_perm). Each lane loads its four words (j = 0..3) and passes word j to both
//   selectors; only the selected threads' copies are read.
// - Work partition, pipeline and split-k fixup follow the dense kernel (marlin_kernel.cuh): tiles of (column strip,
//   stage depth) numbered column by column, one contiguous run per block, partial strips combined through the
//   workspace in block order (bit-reproducible), a cp.async ring of STAGES stages.
// - Block: NS column warps (128 columns each) x 4 k warps, each taking KQ k32 rows of every 128 * KQ-deep stage;
//   m in chunks of 8 * TT rows (TT 8-row tiles of operand B), several chunks side by side.
#pragma once

#include "marlin24.h"

#include "marlin_kernel.cuh"  // PTX wrappers (cp.async, ldmatrix), int4 -> fp16 dequantization, fp16x2 helpers

namespace marlin_cli {
namespace sparse24 {

using detail::bcast_hi;
using detail::bcast_lo;
using detail::cp_async16;
using detail::cp_async16_zfill;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::dequant;
using detail::hmul2;
using detail::ldmatrix_x4;
using detail::write_strip;

// D (16 x 8, fp32) += A (16 x 32, 2:4 sparse fp16: 4 registers of kept values + one metadata word) x B (32 x 8 fp16).
// SEL: which two threads of each group of four supply the metadata. The kept positions of every group are stored in
// increasing order, so the ::ordered_metadata form (the fast one on newer GPUs) applies.
template <int SEL>
__device__ __forceinline__ void mma_sp_16832(const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t meta,
                                             float (&c)[4]) {
  asm("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, %13;\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(meta),
        "n"(SEL));
}

// The sparse A operands of tiles (j, 0) and (j, 1) from word j of a lane's two chunks of codes (wx: the tiles' rows
// g, wy: rows g + 8), times the packed group scales sx, sy of those rows when GROUPED (a scale word pairs the
// columns j and j + 4 of each run of 8: marlin24.scale_perm), rows g and g + 8 interleaved as mma.sp and wgmma.sp
// read them.
template <bool GROUPED>
__device__ __forceinline__ void tile_pair(uint32_t wx, uint32_t wy, uint32_t sx, uint32_t sy, uint32_t (&a0)[4],
                                          uint32_t (&a1)[4]) {
  uint32_t x0[2], x1[2], y0[2], y1[2];
  dequant(wx, x0, x1);
  dequant(wy, y0, y1);
  if (GROUPED) {
    const uint32_t sx0 = bcast_lo(sx), sx1 = bcast_hi(sx), sy0 = bcast_lo(sy), sy1 = bcast_hi(sy);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      x0[h] = hmul2(x0[h], sx0);
      x1[h] = hmul2(x1[h], sx1);
      y0[h] = hmul2(y0[h], sy0);
      y1[h] = hmul2(y1[h], sy1);
    }
  }
  a0[0] = x0[0], a0[1] = y0[0], a0[2] = x0[1], a0[3] = y0[1];
  a1[0] = x1[0], a1[1] = y1[0], a1[2] = x1[1], a1[3] = y1[1];
}

template <int TT_, int NS_, int KQ_, int STAGES_>
struct Cfg {
  static constexpr int TT = TT_;          // 8-row tiles of A per chunk (chunk = 8 * TT rows)
  static constexpr int NS = NS_;          // 128-column warp strips per block
  static constexpr int KQ = KQ_;          // k32 rows per warp per stage
  static constexpr int STAGES = STAGES_;  // depth of the cp.async ring
  static constexpr int NK = 4;            // k warps
  static constexpr int KT = NK * KQ;      // k32 rows per stage (the stage is 32 * KT deep)
  static constexpr int DEPTH = 32 * KT;   // k per tile
  static constexpr int WARPS = NS * NK;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int R = 8 * TT;        // rows of the A / C tile
  static constexpr int W = 128 * NS;      // columns of the block tile
  static constexpr int A_CHUNKS = 4 * KT;       // 16-byte chunks per A row per stage
  static constexpr int A_STAGE = R * A_CHUNKS;  // int4 per stage
  static constexpr int B_STAGE = KT * NS * 64;  // packed k32 rows x 128 columns: 1 KB per row and strip
  static constexpr int M_STAGE = KT * NS * 32;  // metadata: 512 B per k32 row and strip
  static constexpr int S_STAGE = KT * NS * 16;  // up to KT scale rows (group size 32), W / 8 int4 each
  static constexpr int STAGE = A_STAGE + B_STAGE + M_STAGE + S_STAGE;
  static constexpr int RED_STRIDE = W + 4;  // floats; see red_col
  static constexpr int RED = R * RED_STRIDE;
  // Short chunks: 512 threads per SM for 8-row tiles (<= 128 registers), 384 for 16-row tiles (<= 168: their 64
  // accumulators plus fragments spill at 128), so one block's math covers another's waits where blocks are small.
  static constexpr int MIN_BLOCKS = TT == 1 ? 512 / THREADS : TT == 2 ? 384 / THREADS : 1;
  static constexpr int RING = STAGES * STAGE * 16;
  static constexpr int RED_SLICES = detail::red_slices(NK, RING, RED * 4, MIN_BLOCKS);  // meet_k_warps
  static constexpr int SMEM = RING + RED_SLICES * RED * 4;
  static_assert(B_STAGE == 2 * KQ * THREADS && M_STAGE == KQ * THREADS, "every thread copies the same B and metadata");
  static_assert(S_STAGE <= KQ * THREADS, "KQ scale chunks per thread at most");
  static_assert(R * W <= kMaxTileElems, "partial tiles must fit their workspace slot");
};

// The four 32-bit words of a 16-byte shared-memory load.
struct Words {
  uint32_t w[4] = {0, 0, 0, 0};
  Words() = default;
  __device__ explicit Words(const int4& v)
      : w{static_cast<uint32_t>(v.x), static_cast<uint32_t>(v.y), static_cast<uint32_t>(v.z),
          static_cast<uint32_t>(v.w)} {}
  __device__ uint32_t operator[](int i) const { return w[i]; }
};

// The dense kernels' parameters (b: the kept codes) and the metadata.
struct Params : detail::Params {
  const int4* meta;
};

// Column of `red` holding output column n of the block tile: within each 128-column warp strip, n = 16g + y sits at
// 8y + g, so the 32 lanes' stores of one accumulator (8 values of g x 4 of t, rows 2t apart) hit 32 different banks
// with RED_STRIDE = 4 (mod 32).
__device__ __forceinline__ int red_col(int n) { return (n & ~127) | ((n & 15) << 3) | ((n >> 4) & 7); }

template <class C, bool GROUPED>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) gemm24_kernel(const Params p) {
  extern __shared__ int4 smem[];
  float* red = reinterpret_cast<float*>(smem + C::STAGES * C::STAGE);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int n_warp = warp % C::NS;
  const int k_warp = warp / C::NS;  // which KQ k32 rows of each stage this warp computes
  const int g = lane / 4, t = lane % 4;

  detail::Run run;
  if (!detail::plan_run(p.m, p.n, p.k, C::R, C::W, C::DEPTH, p.blocks_per_chunk, run)) return;
  const int chunk = run.chunk, m_rows = run.m_rows, k_tiles = run.k_tiles;

  const int4* a_g = p.a + static_cast<int64_t>(chunk) * C::R * (p.k / 8);
  int4* c_g = p.c + static_cast<int64_t>(chunk) * C::R * (p.n / 8);
  const int b_row = p.n / 2;  // int4 per packed k32 row (2n int32)
  const int m_row = p.n / 4;  // int4 per metadata row (2n int16)
  const int s_row = p.n / 8;  // int4 per scale row
  const int a_row = p.k / 8;  // int4 per A row

  // --- loads of one stage: per-thread parts computed once, the tile's bases once per stage -----------------------
  // Entry e of a stage's copy of rows of `width` chunks, from global rows `stride` chunks apart.
  auto source = [](int e, int width, int stride) { return static_cast<int64_t>(e / width) * stride + e % width; };
  // B: thread copies entries e = tid + i * THREADS of the stage's KT x (W / 2) chunks. Within each 128-column row
  // (64 chunks) chunks 8g + t and 8g + 4 + t trade places for odd g, so the 8 lanes of one phase of a 16-byte
  // shared load (two groups g) hit 8 different bank groups.
  constexpr int B_PER = C::B_STAGE / C::THREADS;
  int64_t b_src[B_PER];
  int b_dst[B_PER];
#pragma unroll
  for (int i = 0; i < B_PER; ++i) {
    const int e = tid + i * C::THREADS;
    b_src[i] = source(e, C::W / 2, b_row);
    b_dst[i] = e ^ ((e >> 1) & 4);
  }
  // Metadata: within each 128-column row (32 chunks = 4 blocks of 8) chunk q of block B sits at q ^ B, which makes
  // the lanes' word loads conflict-free (see m_off).
  constexpr int M_PER = C::M_STAGE / C::THREADS;
  int64_t m_src[M_PER];
  int m_dst[M_PER];
#pragma unroll
  for (int i = 0; i < M_PER; ++i) {
    const int e = tid + i * C::THREADS;
    m_src[i] = source(e, C::W / 4, m_row);
    m_dst[i] = e ^ ((e >> 3) & 3);
  }
  // A: R rows x A_CHUNKS chunks, chunk j of row r at r * A_CHUNKS + (j ^ (r % 8)) (conflict-free ldmatrix); rows
  // past m are zero-filled without a global read.
  constexpr int A_PER = (C::A_STAGE + C::THREADS - 1) / C::THREADS;
  int a_src[A_PER], a_dst[A_PER], a_bytes[A_PER];
#pragma unroll
  for (int i = 0; i < A_PER; ++i) {
    const int idx = tid + i * C::THREADS;
    const int r = idx / C::A_CHUNKS;
    const int j = idx % C::A_CHUNKS;
    const bool ok = r < m_rows && idx < C::A_STAGE;
    a_src[i] = (ok ? r : 0) * a_row + j;
    a_dst[i] = r * C::A_CHUNKS + (j ^ (r % 8));
    a_bytes[i] = ok ? 16 : 0;
  }
  // Scales: the KT >> lg_group group rows of a stage, W / 8 chunks each.
  const int s_rows = C::KT >> p.lg_group;
  const int s_count = GROUPED ? s_rows * (C::W / 8) : 0;
  constexpr int S_PER = (C::S_STAGE + C::THREADS - 1) / C::THREADS;
  int64_t s_src[S_PER];
#pragma unroll
  for (int i = 0; i < S_PER; ++i) s_src[i] = source(tid + i * C::THREADS, C::W / 8, s_row);

  int ld_col = run.t_begin / k_tiles;
  int ld_kt = run.t_begin - ld_col * k_tiles;
  auto load_stage = [&](int4* st, detail::Copies what, int kt) {  // as StageLoader::load
    const bool weights = what != detail::Copies::kActs, acts = what != detail::Copies::kWeights;
    const int a_tile = (what == detail::Copies::kActs ? kt : ld_kt) * C::A_CHUNKS;
    int4* sa = st;
    int4* sb = sa + C::A_STAGE;
    int4* sm = sb + C::B_STAGE;
    int4* ss = sm + C::M_STAGE;
    const int64_t row = static_cast<int64_t>(ld_kt) * C::KT;  // first k32 row of the tile
    const int4* b_base = p.b + row * b_row + ld_col * (C::W / 2);
    const int4* m_base = p.meta + row * m_row + ld_col * (C::W / 4);
#pragma unroll
    for (int i = 0; i < B_PER; ++i) {
      if (weights) cp_async16(sb + b_dst[i], b_base + b_src[i]);
    }
#pragma unroll
    for (int i = 0; i < M_PER; ++i) {
      if (weights) cp_async16(sm + m_dst[i], m_base + m_src[i]);
    }
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
      if (acts && (C::A_STAGE % C::THREADS == 0 || tid + i * C::THREADS < C::A_STAGE)) {
        cp_async16_zfill(sa + a_dst[i], a_g + a_tile + a_src[i], a_bytes[i]);
      }
    }
    const int4* s_base = p.s + static_cast<int64_t>(ld_kt) * s_rows * s_row + ld_col * (C::W / 8);
#pragma unroll
    for (int i = 0; i < S_PER; ++i) {
      if (weights && tid + i * C::THREADS < s_count) cp_async16(ss + tid + i * C::THREADS, s_base + s_src[i]);
    }
    if (!weights) return;
    if (++ld_kt == k_tiles) {
      ld_kt = 0;
      ++ld_col;
    }
  };

  // --- per-thread shared-memory offsets, fixed for the whole kernel --------------------------------------------
  // Warp (n_warp, k_warp) computes k32 rows k_warp * KQ + qq of each stage; row q of strip n_warp is the region
  // q * NS + n_warp of the stage's B (64 chunks) and metadata (32 chunks).
  const int strip = k_warp * C::KQ * C::NS + n_warp;
  const int b_x = C::A_STAGE + strip * 64 + 8 * g + t + 4 * (g & 1);        // chunk 8g + t (swizzled)
  const int b_y = C::A_STAGE + strip * 64 + 8 * g + t + 4 * (1 - (g & 1));  // chunk 8g + 4 + t
  int m_off[4];  // uint32 offsets of the four metadata words
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int blk = g / 2;
    const int q = 4 * (t / 2) + (j ^ blk);  // chunk j + 4p of block g / 2, swizzled
    m_off[j] = (C::A_STAGE + C::B_STAGE + strip * 32 + 8 * blk + q) * 4 + 2 * (g & 1) + (t & 1);
  }
  int s_off[C::KQ], a_off[C::KQ];
#pragma unroll
  for (int qq = 0; qq < C::KQ; ++qq) {
    const int q = k_warp * C::KQ + qq;
    s_off[qq] = C::A_STAGE + C::B_STAGE + C::M_STAGE + (q >> p.lg_group) * (C::W / 8) + n_warp * 16 + 2 * g;
    // ldmatrix.x4 of 8 rows x 32 K: lanes 8m..8m+7 address rows 0..7 of K chunk 4q + m.
    a_off[qq] = (lane % 8) * C::A_CHUNKS + ((4 * q + lane / 8) ^ (lane % 8));
  }

  // TT row tiles x 8 mma tiles (j, p) x 4: independent accumulator chains, one per mma.
  float acc[C::TT][4][2][4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int i = 0; i < C::TT; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][q][e] = 0.f;
  };
  zero_acc();

  auto compute_stage = [&](const int4* st) {
#pragma unroll
    for (int qq = 0; qq < C::KQ; ++qq) {
      uint32_t af[C::TT][4];
#pragma unroll
      for (int i = 0; i < C::TT; ++i) ldmatrix_x4(af[i], st + a_off[qq] + i * 8 * C::A_CHUNKS);
      const Words wx(st[b_x + qq * C::NS * 64]), wy(st[b_y + qq * C::NS * 64]);
      const uint32_t* st32 = reinterpret_cast<const uint32_t*>(st);
      uint32_t mw[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) mw[j] = st32[m_off[j] + qq * C::NS * 32 * 4];
      Words vx, vy;
      if (GROUPED) {
        vx = Words(st[s_off[qq]]);
        vy = Words(st[s_off[qq] + 1]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // tile (j, p): rows 16g + j + 4p (chunk 8g + t) and + 8 (chunk 8g + 4 + t)
        uint32_t a0[4], a1[4];
        tile_pair<GROUPED>(wx[j], wy[j], vx[j], vy[j], a0, a1);
#pragma unroll
        for (int i = 0; i < C::TT; ++i) {
          mma_sp_16832<0>(a0, af[i], mw[j], acc[i][j][0]);
          mma_sp_16832<1>(a1, af[i], mw[j], acc[i][j][1]);
        }
      }
    }
  };

  // --- end of a run inside one column strip: add the k warps, then write C or a partial ------------------------
  constexpr int groups8 = C::R * (C::W / 8);  // 8-column groups of the tile
  auto finish = [&](int col, int seg_begin, int seg_end) {
    // 1. The k warps' tiles meet in `red` (meet_k_warps). Accumulator (i, j, p, e) of lane (g, t) is row
    //    8i + 2t + e % 2, column 16g + j + 4p + 8 (e / 2) of the warp's strip.
    detail::meet_k_warps<C::NK, C::RED_SLICES>(red, C::RED, k_warp, [&](float* tile, bool first) {
#pragma unroll
      for (int i = 0; i < C::TT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = 8 * i + 2 * t + (e & 1);
              const int y = j + 4 * q + 8 * (e >> 1);
              float* dst = tile + row * C::RED_STRIDE + n_warp * 128 + 8 * y + g;
              *dst = first ? acc[i][j][q][e] : *dst + acc[i][j][q][e];
            }
    });
    // 2. 8 consecutive columns per thread: 16-byte stores of C.
    auto gather = [&](int e, float (&v)[8]) {
      const float* src = red + (e / (C::W / 8)) * C::RED_STRIDE;
      const int n0 = (e % (C::W / 8)) * 8;
#pragma unroll
      for (int x = 0; x < 8; ++x) v[x] = detail::met<C::RED_SLICES>(src + red_col(n0 + x), C::RED);
    };
    auto store = [&](int e, const float (&v)[8]) {
      const int r = e / (C::W / 8), n0 = col * C::W + e % (C::W / 8) * 8;
      c_g[static_cast<int64_t>(r) * (p.n / 8) + n0 / 8] = detail::scaled_row8<GROUPED, false>(v, p.s, n0);
    };
    write_strip<C::THREADS, C::W / 8>(detail::segment_part(p, run, C::R * C::W, col, seg_begin, seg_end), groups8,
                                      m_rows, gather, store);
    zero_acc();  // `red` is next written after the main loop's barrier, so no barrier is needed here
  };

  // --- main loop: the dense kernels' (stage addresses back to pointers for this kernel's loads) --------------
  const uint32_t ring = detail::smem_addr(smem);
  auto at = [&](uint32_t st) { return smem + (st - ring) / 16; };
  detail::pipeline<C::STAGES, C::STAGE * 16>(
      run, ring, p.early_dependents, [&](uint32_t st, detail::Copies what, int kt) { load_stage(at(st), what, kt); },
      [] {}, [&](uint32_t st) { compute_stage(at(st)); }, finish);
}

// The 2:4 wgmma kernel on sm_90a (marlin24_sm90.cu): one warpgroup per block, R-row chunks (wgmma's n: 64, 32 for m =
// 17-32, 16 for m <= 16, 8 for m <= 8 on most layers: marlin24.cu) by W-column tiles (two 128-column strips of the
// layout, or one on narrow layers: detail::sm90_cols64; 64-row chunks by one only, since 64 x 256 tiles run on
// Sm90WsCfg: perf-log w10), stages of KT k32 rows: 2 (64 deep, one 128-byte swizzle row of A per row); for 32-row
// chunks 4 (64-deep stages: 7B / 70B m = 17-32 +5% / +12%, perf-log o7), for 8- and 16-row ones 4, and 8 at 256
// columns (the A tile 64-deep swizzle panels; the per-stage work then serves more weights: perf-log s10, s11).
template <int W_, int R_ = 64, int BLOCKS_ = kMaxBlocksPerSm>
struct Sm90Cfg {
  static constexpr int THREADS = 128;  // one warpgroup
  static constexpr int BLOCKS = BLOCKS_;  // blocks per SM: two, three on 16 / 8 x 128 tiles, four on 8 x 128 ones
  static constexpr int LOAD_TID0 = 0;  // the threads that copy stages (Sm90Loader): all of them
  static constexpr int R = R_;         // rows of the A / C tile: wgmma's n
  static constexpr int W = W_;
  static constexpr int STRIPS = W / 128;  // 128-column strips of the tile
  static constexpr int NS = STRIPS;       // of the warpgroup; also the packed words a warp takes of each chunk
  static constexpr int KT = R <= 16 ? (W == 256 ? 8 : 4) : R == 32 ? 4 : 2;  // k32 rows per stage
  static constexpr int DEPTH = 32 * KT;       // k per tile
  static constexpr int A_CHUNKS = 4 * KT;
  static constexpr int A_STAGE = R * A_CHUNKS;  // int4 per stage
  static constexpr int B_STAGE = KT * W / 2;    // packed k32 rows: 64 chunks per 128 columns
  static constexpr int M_STAGE = KT * W / 4;    // metadata: 32 chunks per k32 row and 128 columns
  static constexpr int S_STAGE = KT * W / 8;    // up to KT scale rows (group size 32)
  static constexpr int STAGE = (A_STAGE + B_STAGE + M_STAGE + S_STAGE + 63) / 64 * 64;  // whole swizzle atoms
  // 8- to 32-row chunks: as many stages as BLOCKS blocks per SM hold, at most 8 (two blocks: 3 / 5 at 256 columns,
  // 8 / 7 at 128, 16 / 32 rows; three: 6 at 16 x 128, 8 at 8 x 128), four blocks one fewer (5 at 8 x 128: the ring
  // perf-log b4; the 6 that fit were 3-4% slower on 14336 x 4096 at m <= 8: b6); 64-row chunks: 8
  static constexpr int STAGES = R == 64 ? 8 : detail::sm90_stages_fit(STAGE, BLOCKS) - (BLOCKS == 4);
  static constexpr int SMEM = STAGES * STAGE * 16 + 1024;  // + room to align the ring to 1024 bytes
  static constexpr int C_ROWS = 0;  // whole strips go to C from the registers (store_registers)
  static constexpr int ACC = R / 2;                        // accumulators per thread per wgmma (m64 x nR / 128)
  static_assert(W == 128 || W == 256, "one or two strips");
  static_assert(R == 8 || R == 16 || R == 32 || R == 64, "wgmma.sp's n: 8, 16, 32 or 64");
  static_assert(R != 64 || W == 128, "64 x 256 tiles run on the warp-specialized kernel (Sm90WsCfg)");
  static_assert(A_CHUNKS % 8 == 0, "the A tile must be whole 128-byte swizzle panels: 64 fp16 per row");
  static_assert(STAGES >= 3, "a ring of at least 3 stages");
  static_assert(SMEM <= detail::sm90_smem(BLOCKS), "BLOCKS blocks per SM");
  static_assert(detail::sm90_blocks_fit(BLOCKS, R, W, DEPTH), "blocks per SM: sm90_blocks_fit");
};
// The warp-specialized 2:4 kernel (marlin24_sm90.cu; the dense kernel's Sm90WsCfg): R-row chunks (128, 96 up to m =
// 96, 64 up to m = 64; 16, or 8 for m <= 8, on long runs: ws_small_cols) by W columns, one block per SM of two
// computing warpgroups and one copying warpgroup (its first thread: the A tile by a tensor copy per 64-deep panel, the
// rest by bulk copies), a ring of 128-deep stages. At W = 512 (m <= 16) each computing warpgroup takes two 128-column
// strips (four m64nRk32 per k32 row, the one-warpgroup kernels' 256-column share), at W = 256 one strip on all R rows
// (two); at W = 128 (layers too narrow for 256-column tiles, R = 96 or 128) both take the one strip, each on its R / 2
// rows (a row block: two m64n(R/2)k32), since in this lane layout a strip's columns cannot be split between warpgroups.
template <int W_, int R_>
struct Sm90WsCfg : detail::WsBlock {
  static constexpr int LOAD_TID0 = THREADS;  // the copying warpgroup's first thread: every copy of a stage
  static constexpr int BLOCKS = 1;           // per SM
  static constexpr int R = R_, W = W_;
  static constexpr int STRIPS = W / 128;
  static constexpr int NS = STRIPS > CONSUMERS ? STRIPS / CONSUMERS : 1;  // the packed words a warp takes of each chunk
  static constexpr int KT = 4, DEPTH = 32 * KT, A_CHUNKS = 4 * KT;  // 128 deep (perf-log s18)
  static constexpr int A_STAGE = R * A_CHUNKS;
  static constexpr int B_STAGE = KT * W / 2;
  static constexpr int M_STAGE = KT * W / 4;
  static constexpr int S_STAGE = KT * W / 8;
  static constexpr int STAGE = (A_STAGE + B_STAGE + M_STAGE + S_STAGE + 63) / 64 * 64;
  // Whole strips go to C through shared memory, 64 rows per round (store_staged): from the registers, this column
  // map's 2-byte stores put each value in a 32-byte sector of its own (perf-log s21).
  static constexpr int C_ROWS = R < 64 ? 16 : 64;
  static constexpr int C_STAGING = C_ROWS * W * 2;  // bytes, after the ring
  static constexpr int STAGES = detail::sm90_ws_stages_fit(STAGE, C_STAGING);
  static constexpr int SMEM = STAGES * STAGE * 16 + C_STAGING + 1024;
  // accumulators per thread per wgmma: its rows x 64 / 128
  static constexpr int ACC = STRIPS >= CONSUMERS ? R / 2 : R / 2 / (CONSUMERS / STRIPS);
  static_assert((W == 512 && (R == 8 || R == 16)) || (W == 256 && (R == 16 || R >= 64)) ||
                    (W == 128 && (R == 96 || R == 128)),
                "one strip for both computing warpgroups (a row block of R / 2 each), one each, or two each");
  static_assert(STAGES >= 4, "a ring of at least 4 stages");
  static_assert(R * W <= kMaxBlocksPerSm * kMaxTileElems, "one block per SM: its partial tile takes two blocks' slots");
};
// Whether the wgmma.sp kernel's rows x cols tiles from 33 rows run on the warp-specialized block (Sm90WsCfg, one block
// per SM): from 96 rows, and 64 x 256 (64 x 128 tiles keep the one-warpgroup block, two per SM: perf-log w10).
inline bool ws_tile(int rows, int cols) { return rows > 64 || (rows == 64 && cols == 256); }
// The width of the warp-specialized kernel's tiles for m <= 16 rows of an n x k layer over `sms` SMs, 0 where the
// one-warpgroup kernels run it: 512 columns, else (m > 8) 256, where one block per SM gets runs of at least 16 tiles
// (128 deep) and adds its split strips' parts itself (own_parts). At 512 columns the computing warpgroups run the
// one-warpgroup 256-column blocks' chains, two per SM as those do, without their block barrier and cp.async (one
// thread's bulk and tensor copies; three stages' weights ahead of the wait for the previous kernel). On runs of 16-101
// tiles: level to 8% faster at m = 1-8 (one layer 3% slower), 4-18% at m = 16. At 256 columns (a strip per
// warpgroup) 4-6% faster at m = 16 on runs of 21-27, level to 6% slower at m <= 8. On runs of 6-11, or with
// add_parts_kernel (28672 x 8192: runs of 28 on strips of 224), 4-27% slower (perf-log ws16, ws17).
inline int ws_small_cols(int m, int n, int k, int sms) {
  for (const int cols : {512, 256}) {
    if (n % cols != 0 || (cols == 256 && m <= 8)) continue;
    const int n_cols = n / cols, k_tiles = k / 128;
    if (detail::tiles_per_run(n_cols * k_tiles, sms) >= 16 && detail::own_parts(sms, n_cols, k_tiles)) return cols;
  }
  return 0;
}
cudaError_t launch_sm90(bool ws, int rows, int cols, int blocks_per_sm, bool grouped, const Params& p, int grid,
                        int device, cudaStream_t stream);

}  // namespace sparse24
}  // namespace marlin_cli
