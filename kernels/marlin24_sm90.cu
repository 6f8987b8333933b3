// FP16 x INT4 GEMM on the Sparse-MARLIN 2:4 layout with Hopper's sparse warpgroup MMA (wgmma.sp), for every m on
// sm_90a (marlin24.cu).
//
// mma.sp runs at about half of the H200's sparse tensor rate, and the sm_80-class 2:4 kernel (marlin24_kernel.cuh)
// re-reads and re-dequantizes every weight for each 32-row chunk of m: from m = 64 on it was slower than the dense
// wgmma kernel. Here, as in marlin_sm90.cu, C^T = W^T A^T: the kept weights are wgmma.sp's sparse register operand
// (m64 = 64 output columns, k32 per instruction, a metadata word per thread) and 64 rows of activations its
// shared-memory operand (the 128-byte-swizzled A tile, 32 deep per instruction).
//
// The layout makes this free, as in the mma.sp kernel: lane (g, t) of a warp reading the 16-byte chunks 8g + t and
// 8g + 4 + t of a 128-column strip's packed k32 row holds, in word j of each, rows g and g + 8 of the 16 x 16 kept
// values of tile (j, p) (p = 0, 1: the low and high nibble pairs), and the metadata word j serves both tiles through
// the two sparsity selectors. A warpgroup instruction takes 16 rows from each warp, so a warp reads word j of every
// chunk: these kernels read B_24 and B_meta in a kernel order made once, when a layer is loaded (kernel_word; the
// checkpoint keeps the stored order, which the mma.sp kernel reads), so that stages can hold them as they lie in memory
// and the lanes' loads are conflict-free (perf-log ko1, ko2). In the one-warpgroup kernel's R x 256 tiles warp w = 2s +
// h takes strip s of the block's two and tiles j = 2h, 2h + 1 of it: four m64nRk32 per k32 row cover the block's 256
// columns. With R x 128 tiles (layers too narrow for 256-column tiles to fill the GPU, as the dense kernel's) warp w
// takes word j = w of the one strip's chunks, and two m64nRk32 cover its 128 columns. Tile (j, p)'s rows g, g + 8 are
// output columns 16g + j + 4p (+ 8) of its strip. Stages are 64 deep for R = 64 (m = 33-64, 128 columns only), 128 for
// R = 32 (m = 17-32) and 128 or, at 256 columns, 256 for R = 16 and 8 (m <= 16: perf-log s10, s11, s24; m <= 8 on most
// layers: r8), the A tile in 64-deep swizzle panels.
//
// Above m = 64 the warp-specialized kernel (gemm24_sm90_ws_kernel) takes R x 256 tiles, R = 96 up to m = 96 and 128
// above: two computing warpgroups, one strip each (warp w its word w % 4, two m64nRk32 per k32 row), and a copying
// warpgroup whose first thread copies each stage, as the dense one does above m = 32 (marlin_sm90.cu): the A tile by
// tensor copies, codes, metadata and scales by bulk copies. On layers too narrow for 256-column tiles it takes R x 128
// ones: both computing warpgroups on the one strip, each on its row block of R / 2 rows (two m64n(R/2)k32 per k32
// row). At m = 33-64 it takes 64 x 256 tiles (two m64n64k32 per warpgroup and k32 row), where the one-warpgroup kernel
// keeps only the 64 x 128 ones (perf-log w10), and at m <= 16 16 x 512, 8 x 512 or 16 x 256 ones on layers whose
// runs are long (ws_small_cols, perf-log ws16; at 512 each computing warpgroup takes two strips). Its blocks write
// whole strips to C through shared memory (store_staged: this column map's 2-byte stores from the registers put each
// value in a sector of its own) and add split strips' parts themselves where runs are long (own_parts), as the dense
// ones do (perf-log s21, s22).
//
// Everything else is the dense wgmma kernels': the striped partition, the pipeline, parts of split column strips
// saved straight from the registers and added by add_parts_kernel (wgmma.cuh), chunks side by side for larger m.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMARLIN_SM90A -c kernels/marlin24_sm90.cu
// (for other targets the kernel bodies are empty and the host never launches them).
#include "marlin24_kernel.cuh"
#include "wgmma.cuh"

namespace marlin_cli {
namespace sparse24 {

using namespace detail;

// The kernel order of B_24 and B_meta (marlin_cli.formats.marlin24.to_kernel_order, made when a layer is loaded):
// blocks of one 128-column strip's four k32 rows of a 128-deep tile, tile by tile and strip by strip within a tile
// (kTileB int4 of codes and kTileM of metadata per tile and strip). In a k32 row of codes each (strip, word) is a
// run of 64 words, the h = 0 and h = 1 halves rotated so that a computing warp's 32 lanes (one word w, lane (g, t):
// one word per half) hit 32 banks; the metadata's 16-byte chunks are swizzled within each row of a strip (chunk c at
// c ^ (c >> 3 & 3)), so that the lanes' metadata loads (TileWords::m_off) are conflict-free too. Stages hold codes
// and metadata strip by strip, row by row, as they lie in memory: the warp-specialized kernel copies a stage's codes
// and metadata by a bulk copy each, the one-warpgroup kernels (stages of 2, 4 or 8 k32 rows) by 16-byte cp.async.
constexpr int kTileB = 4 * 64, kTileM = 4 * 32;

// Where k32 row `row` of 128-column strip `strip` begins in the kernel order, in int4 from `base`: TILE is kTileB for
// the codes, kTileM for the metadata; n is the layer's column count.
template <int TILE>
__device__ __forceinline__ const int4* kernel_row(const int4* base, int n, int strip, int row) {
  return base + (row >> 2) * (int64_t{TILE} * (n / 128)) + strip * TILE + (row & 3) * (TILE / 4);
}

// Byte offset in a stage of word w of chunk 8g + 4h + t of strip s's k32 row 0 of the stage (row q adds 1024 bytes).
template <class C>
__device__ __forceinline__ uint32_t kernel_word(int s, int w, int h, int g, int t) {
  return (C::A_STAGE * 4 + s * C::KT * 256 + w * 64 + h * 32 + ((4 * g + t + 4 * h + 8 * w) & 31)) * 4;
}

// Copies of one stage for the one-warpgroup kernels: the A tile (R rows x A_CHUNKS chunks as 64-deep panels of R
// rows in the 128-byte swizzle, rows past m zero-filled), the codes and metadata of KT k32 rows x W columns and the
// scale rows the stage spans. Per-thread parts are computed once; the next tile's bases advance by additions.
template <class C, bool GROUPED>
struct Sm90Loader {
  static constexpr int T = 128;  // copying threads: from C::LOAD_TID0 on
  // A: a pass copies 16 rows of one 64-deep panel (8 chunks per row), or the 8 rows of two, one chunk per thread
  static constexpr int PANELS = C::A_CHUNKS / 8;  // 64-deep panels of the A tile
  static constexpr int A_ROWS = C::R < 16 ? C::R : 16, A_PP = 16 / A_ROWS;  // rows and panels per pass
  static constexpr int B_PER = C::B_STAGE / T;
  static constexpr int M_PER = (C::M_STAGE + T - 1) / T;
  static constexpr int S_PER = (C::S_STAGE + T - 1) / T;  // scale rows: KT at most (groups of 32)
  static constexpr int S_ROWS = T / (C::W / 8);
  static_assert(C::B_STAGE % T == 0 && C::KT % 2 == 0, "whole passes, two k32 rows of codes each");
  static_assert(C::M_STAGE <= T || C::KT % 4 == 0, "passes of four whole k32 rows of metadata");
  static_assert(C::M_STAGE <= T || C::M_STAGE % T == 0, "whole passes");
  static_assert((C::R % 16 == 0 || C::R == 8) && PANELS % A_PP == 0, "16 rows of a panel or 8 of two per pass");
  static_assert(C::S_STAGE <= T || C::S_STAGE % T == 0, "whole passes");

  // Shapes, strides and base pointers are read from the kernel parameters (constant memory) when needed, so that
  // the loader holds only what differs per thread or per tile: 255 registers are tight (acc alone is 128).
  const Params& p;
  const int4* a_g;
  int a_src, a_rows;  // A: this thread's chunk of row r0 (panel 0), and the rows that exist from r0 on
  uint32_t a_dst, b_dst, m_dst, s_dst;
  int s_src;  // chunk offset within a scale row
  bool s_copy[S_PER];
  TilePos ld;  // next tile to load

  __device__ __forceinline__ Sm90Loader(const Params& params, const int4* a_chunk, int m_rows, int t_begin)
      : p(params), a_g(a_chunk), ld(t_begin, params.k / C::DEPTH) {
    const int tid = threadIdx.x - C::LOAD_TID0;
    const int r = tid / 8 % A_ROWS, j = tid % 8 + 8 * (tid / (8 * A_ROWS));  // chunk j of the pass's panels
    a_src = r * (p.k / 8) + j;
    a_rows = m_rows - r;
    a_dst = a_panel_chunk<C::R>(r, j) * 16;
    // codes and metadata: chunk e = tid + i * T of the stage's (load)
    b_dst = (C::A_STAGE + tid) * 16;
    m_dst = (C::A_STAGE + C::B_STAGE + tid) * 16;
    // scales: max(1, KT >> lg_group) rows per stage, the first being the stage's first k32 row >> lg_group
    const int s_chunks = max(1, C::KT >> p.lg_group) * (C::W / 8);
#pragma unroll
    for (int i = 0; i < S_PER; ++i) s_copy[i] = GROUPED && tid + i * T < s_chunks;
    s_src = (tid / (C::W / 8)) * (p.n / 8) + tid % (C::W / 8);
    s_dst = (C::A_STAGE + C::B_STAGE + C::M_STAGE + tid) * 16;
  }

  __device__ __forceinline__ void load(uint32_t st, Copies what = Copies::kAll, int kt = 0) {
    const int tid = threadIdx.x - C::LOAD_TID0;
    const int row = ld.kt * C::KT;  // first k32 row of the tile
    const bool weights = what != Copies::kActs, acts = what != Copies::kWeights;
    const int a_tile = (what == Copies::kActs ? kt : ld.kt) * C::A_CHUNKS;
    if (weights) {
      // Chunk e = tid + i * T of the stage's codes is chunk e % 64 of row q = e / 64 % KT of strip e / 64 / KT, of its
      // metadata chunk e % 32 of row e / 32 % KT of strip e / 32 / KT; rows 4 apart lie a tile of every strip apart.
      // A pass's first row q0 and strip are constants, and tid adds less than 4 - q0 % 4 rows to it (KT is even,
      // and at least 4 where the metadata takes more than one pass), so the offset is a constant plus tid.
      const int strip0 = ld.col * C::STRIPS;
      const int4* b = kernel_row<kTileB>(p.b, p.n, strip0, row) + tid;
#pragma unroll
      for (int i = 0; i < B_PER; ++i) {
        constexpr int kRows = T / 64;
        const int q0 = i * kRows % C::KT, s = i * kRows / C::KT;
        cp_async16(st + b_dst + i * T * 16, kernel_row<kTileB>(b, p.n, s, q0));
      }
      const int4* m = kernel_row<kTileM>(p.meta, p.n, strip0, row) + tid;
#pragma unroll
      for (int i = 0; i < M_PER; ++i) {
        constexpr int kRows = T / 32;
        const int q0 = i * kRows % C::KT, s = i * kRows / C::KT;
        if (C::M_STAGE >= T || tid < C::M_STAGE) {  // fewer chunks than threads: one pass, some threads
          cp_async16(st + m_dst + i * T * 16, kernel_row<kTileM>(m, p.n, s, q0));
        }
      }
    }
    if (acts) {
#pragma unroll
      for (int pn = 0; pn < PANELS; pn += A_PP)
#pragma unroll
        for (int q = 0; q < C::R / A_ROWS; ++q) {
          const bool real = 16 * q < a_rows;  // rows past m: zero-filled, the source clamped to row 0
          cp_async16_zfill(st + a_dst + (pn * C::R + 16 * q) * 128,
                           a_g + a_tile + 8 * pn + (real ? a_src + 16 * q * (p.k / 8) : 0),
                           real ? 16 : 0);
        }
    }
    if (weights) {
#pragma unroll
      for (int i = 0; i < S_PER; ++i) {
        if (s_copy[i]) {
          cp_async16(st + s_dst + i * T * 16, p.s + static_cast<int64_t>((row >> p.lg_group) + i * S_ROWS) *
                                                                  (p.n / 8) + ld.col * (C::W / 8) + s_src);
        }
      }
    }
    if (weights) ld.next(p.k / C::DEPTH);
  }
};

// Where thread tid's accumulators land (wgmma_run, add_parts_kernel): element 4i + e of tile u = 2jj + p is output
// column x0(col, tid) + of(u, e / 2) of column strip col, i.e. 128 strip + 16g + word0 + jj + 4p + 8(e / 2) of the
// block's tile (strip, word0: the warp's, as in the kernel); per-channel scales in column order.
template <class C>
struct SparseCols {
  static __device__ __forceinline__ int x0(int col, int tid) {
    const int warp = tid / 32;
    return col * C::W + warp_strip<C::NS>(warp) * 128 + 16 * (tid % 32 / 4) + warp_word0<C::NS>(warp);
  }
  static __device__ __forceinline__ int of(int u, int h) { return u / 2 + 4 * (u % 2) + 8 * h; }
  static __device__ __forceinline__ int scale(int x) { return x; }
  // store_staged's word of column x in pair-row q: the 4-word group XOR bits 5-6 of x, the word in it XOR q % 4, so
  // that lanes (g, t) (pair-rows 4i + t, columns 16g + k) hit 32 banks and 8 lanes' 16-byte loads of consecutive groups
  // of a pair-row all of them
  static __device__ __forceinline__ int staged(int q, int x) { return q * C::W + (x ^ ((x >> 5 & 3) << 2) ^ (q & 3)); }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte offsets in a stage of config C for thread tid's tiles at k32 row 0 (row q adds q times the row's bytes):
// words word0 + jj (jj < J) of chunks 8g + t and 8g + 4 + t of its warp's strip (kernel_word), metadata words
// j = word0 + jj, scales of those tiles.
template <class C>
struct TileWords {
  static constexpr int J = C::NS;
  static constexpr int N = 2 * C::ACC, TP = C::THREADS / (C::R / N);  // rows of a wgmma, threads per row block
  uint32_t b_x[J], b_y[J], m_off[J], s_off;
  uint32_t a_row;  // the descriptor's offset to this thread's row block in the A panels
  __device__ __forceinline__ explicit TileWords(int tid) {
    const int lane = tid % 32, warp = (TP < C::THREADS ? tid % TP : tid) / 32;
    a_row = TP < C::THREADS ? warp_uniform(tid / TP) * N * 128 >> 4 : 0;
    const int strip = warp_strip<C::NS>(warp), word0 = warp_word0<C::NS>(warp);
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      b_x[jj] = kernel_word<C>(strip, word0 + jj, 0, g, t);
      b_y[jj] = kernel_word<C>(strip, word0 + jj, 1, g, t);
      const int blk = g / 2, q = 4 * (t / 2) + ((word0 + jj) ^ blk);
      m_off[jj] = ((C::A_STAGE + C::B_STAGE + strip * C::KT * 32 + 8 * blk + q) * 4 + 2 * (g & 1) + (t & 1)) * 4;
    }
    s_off = (C::A_STAGE + C::B_STAGE + C::M_STAGE + strip * 16 + 2 * g) * 16 + 4 * word0;
  }
};

// One stage at st into acc[2jj + p] (tile (word0 + jj, p) of every warp): per k32 row the words, metadata and scales
// from the stage, the kept values' fragments (tile_pair) and 2J wgmma.sp of 64 x R. After each row's group the wait
// leaves L groups in flight; at the stage's end all are retired (DRAIN), or the last L + 1 stay in flight for
// ws_kernel (perf-log w9, s14, s17), at most the stage's KT, so none of them remains once the next stage is computed
// and ws_kernel releases the slot then. The next row's words are read before the wait, so the shared-memory latency
// hides behind it (perf-log s15); in 8-row chunks and three-block 16 x 128 tiles before the row's wgmma.sp (pb2, p3),
// in other 16-row ones after the wait.
// ptxas does not keep a group's metadata register until the group retires, as it does its fragments: it rewrites it
// once the wgmma.sp has issued, and the hardware reads it later. Rewrites 20 and 57 instructions after the issue gave
// wrong outputs, 65 or more never have (perf-log s15, s17; 100 since s22); scripts/check_meta_hazards.py reports a
// build's nearest.
template <class C, bool GROUPED, bool DRAIN, int L, int U>
__device__ __forceinline__ void compute_stage(uint32_t st, const TileWords<C>& w, int lg_group,
                                              float (&acc)[U][C::ACC]) {
  constexpr int J = U / 2, KT = C::KT;
  constexpr uint32_t kBRow = 64 * 16, kMRow = 32 * 16, kSRow = C::W / 8 * 16;  // a k32 row of a strip; of scales
  static_assert(L >= 1 && L < KT, "a wait leaves 1 to KT - 1 groups in flight, so a stage's last L + 1 fit in it");
  struct Row {
    uint32_t wx[J], wy[J], mw[J], vx[J] = {}, vy[J] = {};
  };
  // Where the next row's words are read: before this row's wgmma.sp (8-row chunks, perf-log pb2; 16-row chunks at
  // three blocks per SM, measured on 11008 x 4096's runs of 7 tiles: p3), before its wait (32 rows and more, s15) or
  // after it (other 16-row chunks: earlier gained on long runs and lost 0.2-1 us a layer on runs of 3-5, pb1, pk1)
  enum { kBeforeIssue, kBeforeWait, kAfterWait };
  constexpr int kNext = [] {
    if constexpr (C::R == 16) return C::BLOCKS == 3 ? int{kBeforeIssue} : int{kAfterWait};
    return C::R == 8 ? int{kBeforeIssue} : int{kBeforeWait};
  }();
  constexpr bool kKeep = C::R > 16;  // a scale group's later rows keep its scales (perf-log s19)
  Row row[KT];
  auto lds_row = [&](int q) {
    Row& r = row[q];
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      r.wx[jj] = lds32(st + w.b_x[jj] + q * kBRow);
      r.wy[jj] = lds32(st + w.b_y[jj] + q * kBRow);
    }
    if (GROUPED && (!kKeep || q == 0 || (q & ((1 << lg_group) - 1)) == 0)) {
      const uint32_t so = st + w.s_off + (q >> lg_group) * kSRow;
      lds_words(so, r.vx);
      lds_words(so + 16, r.vy);
    } else if (GROUPED) {
#pragma unroll
      for (int jj = 0; jj < J; ++jj) r.vx[jj] = row[q - 1].vx[jj], r.vy[jj] = row[q - 1].vy[jj];
    }
#pragma unroll
    for (int jj = 0; jj < J; ++jj) r.mw[jj] = lds32(st + w.m_off[jj] + q * kMRow);
  };
  lds_row(0);
#pragma unroll
  for (int q = 0; q < KT; ++q) {
    const uint64_t desc = a_panel_desc(st, C::R, 2 * q) + w.a_row;  // k32 row q of A: k16 tiles 2q, 2q + 1
    const Row& r = row[q];
    uint32_t a[2 * J][4];
#pragma unroll
    for (int jj = 0; jj < J; ++jj) tile_pair<GROUPED>(r.wx[jj], r.wy[jj], r.vx[jj], r.vy[jj], a[2 * jj], a[2 * jj + 1]);
    if (q + 1 < KT && kNext == kBeforeIssue) lds_row(q + 1);
    pin(acc);
    wgmma_fence();  // the fragments (and, after a finish, the zeroed accumulators) are written
#pragma unroll
    for (int jj = 0; jj < J; ++jj) {
      wgmma_sp_m64k32<2 * C::ACC, 0>(acc[2 * jj], a[2 * jj], r.mw[jj], desc);
      wgmma_sp_m64k32<2 * C::ACC, 1>(acc[2 * jj + 1], a[2 * jj + 1], r.mw[jj], desc);
    }
    wgmma_commit();
    if (q + 1 < KT && kNext == kBeforeWait) lds_row(q + 1);
    wgmma_wait_tile<KT, DRAIN, L>(q);
    pin(acc);
    if (q + 1 < KT && kNext == kAfterWait) lds_row(q + 1);
  }
}
#endif

template <class C, bool GROUPED>
__global__ void __launch_bounds__(C::THREADS, C::BLOCKS) gemm24_sm90_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int J = C::NS;  // packed words this warp takes of each chunk, and pairs of tiles (j, 0), (j, 1)
  extern __shared__ int4 smem[];

  Run run;
  if (!plan_run(p.m, p.n, p.k, C::R, C::W, C::DEPTH, p.blocks_per_chunk, run)) return;

  const int4* a_g = p.a + static_cast<int64_t>(run.chunk) * C::R * (p.k / 8);
  Sm90Loader<C, GROUPED> loader(p, a_g, run.m_rows, run.t_begin);
  const TileWords<C> w(threadIdx.x);

  // acc[2jj + p]: tile (word0 + jj, p) of every warp (its columns: SparseCols). Element 4i + e of this thread is
  // row 8i + 2t + e % 2 of the chunk.
  float acc[2 * J][C::ACC];
#pragma unroll
  for (int u = 0; u < 2 * J; ++u)
#pragma unroll
    for (int e = 0; e < C::ACC; ++e) acc[u][e] = 0.f;

  wgmma_run<C, SparseCols<C>, GROUPED>(p, run, smem, acc, loader, fence_proxy_async, [&](uint32_t st) {
    compute_stage<C, GROUPED, true, 1>(st, w, p.lg_group, acc);
  });
#endif
}

// The warp-specialized 2:4 kernel (Sm90WsCfg; ws_tile, ws_small_cols): threads 0-255 compute (two warpgroups, one or
// two strips or a row block each), the third warpgroup's first thread copies (ws_kernel): per stage one arrival on the
// slot's full barrier with the stage's byte count, then one bulk copy of the tile's codes and one of its metadata (the
// kernel order lays a tile of the block's strips out as one run of each), one per scale row, and the A tile as a
// tensor copy per 64-deep panel, all charged to it; the first stages' weights before the wait for the previous
// kernel, their A tiles after it. Codes, metadata and scales are read by plain shared loads after the barrier, so no
// proxy fence is needed.
template <class C, bool GROUPED>
__global__ void __launch_bounds__(C::BLOCK_THREADS, 1)
    gemm24_sm90_ws_kernel(const Params p, const __grid_constant__ CUtensorMap a_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(C::KT == 4, "a stage is one 128-deep tile of the kernel order");
  auto copy = [&](const Run& run, const WsRing& ring) {
    if (threadIdx.x != C::LOAD_TID0) return;
    const int s_rows = GROUPED ? max(1, C::KT >> p.lg_group) : 0;  // scale rows a stage spans (groups of 32 and up)
    const uint32_t bytes = (C::A_STAGE + C::B_STAGE + C::M_STAGE) * 16 + s_rows * C::W * 2;
    const int s_row = p.n / 8;  // int4 per scale row
    // the weights of tile `at`; the barrier expects them with the stage's A tile
    auto weights = [&](uint32_t st, uint32_t bar, TilePos at) {
      mbar_expect(bar, bytes);
      const int row = at.kt * C::KT, strip0 = at.col * C::STRIPS;  // the stage's first k32 row and 128-column strip
      bulk_copy(st + C::A_STAGE * 16, kernel_row<kTileB>(p.b, p.n, strip0, row), C::B_STAGE * 16, bar);
      bulk_copy(st + (C::A_STAGE + C::B_STAGE) * 16, kernel_row<kTileM>(p.meta, p.n, strip0, row), C::M_STAGE * 16,
                bar);
      for (int r = 0; r < s_rows; ++r) {
        bulk_copy(st + (C::A_STAGE + C::B_STAGE + C::M_STAGE + r * C::W / 8) * 16,
                  p.s + static_cast<int64_t>((row >> p.lg_group) + r) * s_row + at.col * C::W / 8, C::W * 2, bar);
      }
    };
    auto acts = [&](uint32_t st, uint32_t bar, int kt) {
#pragma unroll
      for (int pn = 0; pn < C::A_CHUNKS / 8; ++pn) {
        tma_load_2d(st + pn * C::R * 128, &a_map, kt * C::DEPTH + 64 * pn, run.chunk * C::R, bar);
      }
    };
    // the first stages' weights before the wait for the previous kernel (it never writes them: a model's weights are
    // written when they are loaded), their A tiles after it: one stage from 64 rows (more were slower, perf-log pw3),
    // three at m <= 16 (ws16)
    constexpr int kAhead = C::R <= 16 ? 3 : 1;
    TilePos ahead(run.t_begin, run.k_tiles), at(run.t_begin, run.k_tiles);
    for (int s = 0; s < kAhead && s < run.n_iter; ++s, ahead.next(run.k_tiles)) {
      weights(ring.ring + s * C::STAGE * 16, ring.full0 + 8 * s, ahead);
    }
    grid_dependency_wait();
    RingPos<C::STAGES> slot;
#pragma unroll 1
    for (int it = 0; it < run.n_iter; ++it, at.next(run.k_tiles)) {
      mbar_wait(ring.empty0 + 8 * slot.slot, slot.phase ^ 1);  // the slot's last stage is done with (at once at first)
      const uint32_t st = ring.ring + slot.slot * C::STAGE * 16, bar = ring.full0 + 8 * slot.slot;
      if (it >= kAhead) weights(st, bar, at);
      acts(st, bar, at.kt);
      slot.next();
    }
  };
  ws_kernel<C, SparseCols<C>, GROUPED, 2 * C::NS>(p, 1, copy, [&](int tid) {
    const TileWords<C> w(tid);
    return [&p, w](uint32_t st, float (&acc)[2 * C::NS][C::ACC]) {
      compute_stage<C, GROUPED, false, 2>(st, w, p.lg_group, acc);  // two groups in flight (perf-log s17, s18)
    };
  });
#endif
}

template <class C>
cudaError_t launch_cols(bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
  return launch_gemm<RegisterParts<C, SparseCols<C>, 2 * C::NS>, false, gemm24_sm90_kernel<C, true>,
                     gemm24_sm90_kernel<C, false>>(grouped, p, grid, C::THREADS, C::SMEM, device, stream);
}

template <class C>
cudaError_t launch_ws(bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
  CUtensorMap map = {};
  if (const cudaError_t err = a_tensor_map(p, C::R, &map); err != cudaSuccess) return err;
  return launch_gemm<RegisterParts<C, SparseCols<C>, 2 * C::NS>, true, gemm24_sm90_ws_kernel<C, true>,
                     gemm24_sm90_ws_kernel<C, false>>(grouped, p, grid, C::BLOCK_THREADS, C::SMEM, device, stream, map);
}

cudaError_t launch_sm90(bool ws, int rows, int cols, int blocks_per_sm, bool grouped, const Params& p, int grid,
                        int device, cudaStream_t stream) {
  if (ws) {
    if (rows == 8) return launch_ws<Sm90WsCfg<512, 8>>(grouped, p, grid, device, stream);
    if (rows == 16) {
      return cols == 512 ? launch_ws<Sm90WsCfg<512, 16>>(grouped, p, grid, device, stream)
                         : launch_ws<Sm90WsCfg<256, 16>>(grouped, p, grid, device, stream);
    }
    if (rows == 64) return launch_ws<Sm90WsCfg<256, 64>>(grouped, p, grid, device, stream);
    if (rows == 96) {
      return cols == 256 ? launch_ws<Sm90WsCfg<256, 96>>(grouped, p, grid, device, stream)
                         : launch_ws<Sm90WsCfg<128, 96>>(grouped, p, grid, device, stream);
    }
    return cols == 256 ? launch_ws<Sm90WsCfg<256, 128>>(grouped, p, grid, device, stream)
                       : launch_ws<Sm90WsCfg<128, 128>>(grouped, p, grid, device, stream);
  }
  if (rows == 8) {  // 128 columns only at three or four blocks per SM (gemm24)
    if (cols == 256) return launch_cols<Sm90Cfg<256, 8>>(grouped, p, grid, device, stream);
    return blocks_per_sm == 4 ? launch_cols<Sm90Cfg<128, 8, 4>>(grouped, p, grid, device, stream)
                              : launch_cols<Sm90Cfg<128, 8, 3>>(grouped, p, grid, device, stream);
  }
  if (rows == 16) {
    if (cols == 256) return launch_cols<Sm90Cfg<256, 16>>(grouped, p, grid, device, stream);
    return blocks_per_sm == 3 ? launch_cols<Sm90Cfg<128, 16, 3>>(grouped, p, grid, device, stream)
                              : launch_cols<Sm90Cfg<128, 16>>(grouped, p, grid, device, stream);
  }
  if (rows == 32) {
    return cols == 256 ? launch_cols<Sm90Cfg<256, 32>>(grouped, p, grid, device, stream)
                       : launch_cols<Sm90Cfg<128, 32>>(grouped, p, grid, device, stream);
  }
  return launch_cols<Sm90Cfg<128>>(grouped, p, grid, device, stream);
}

}  // namespace sparse24
}  // namespace marlin_cli
