// FP16 x INT4 GEMM on the MARLIN dense layout: C (m, n) = A (m, k) @ dequant(B), fp32 accumulation, fp16 output.
//
// Written for this project from the MARLIN paper's design (DESIGN.md 5) and the layout of DESIGN.md 3.1
// (marlin_cli/formats/marlin.py is the executable definition). Build: nvcc -std=c++17 -O3
//   -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 -c kernels/marlin.cu
//
// Shape of the computation:
// - C is cut into column strips of N_B = 64 * NS columns; K into k-tiles of K_B = 16 * KT rows. A "tile" is one
//   (column strip, k-tile) pair: 8 KB of packed weights for every configuration below.
// - Tiles are numbered column by column (k fastest) and every block takes one contiguous run of them ("striped"
//   partition): each block streams the same number of weight bytes whatever the shape, so all SMs stay busy on the
//   awkward real shapes, and a run may cross from one column strip into the next.
// - A block's run covers a whole column strip (written straight to C) or part of one. A part is saved as an fp32
//   tile in the workspace, and when a launch leaves strips split the host launches add_parts_kernel after it, which
//   adds each strip's parts in block order (fixed, so the output is bit-reproducible) and writes C. No block of the
//   GEMM waits for another, or fences and counts its part (perf-log q1), except on the warp-specialized tiles where
//   runs are long (own_parts(): one block adds the strip's parts, in the same order; perf-log f3, o6).
// - m is handled in chunks of 8, 16, 32, 48 or 64 rows; several chunks run side by side as groups of blocks, and each
//   group re-reads the weights, mostly from L2 since the groups walk the same tiles at the same time.
// - Inside a block: 8 warps = NS column warps (64 columns each) x NK k warps; the k warps of a strip split every
//   k-tile between them and their partial sums are added in shared memory at the end of a run.
// - Loads are 16-byte cp.async into a STAGES-deep ring; the ring slot's shared-memory address is one register,
//   advanced once per stage in the loop, so every shared-memory access in the inner loop is that slot plus a
//   per-thread offset fixed for the whole kernel plus an immediate.
#pragma once

#include "marlin.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace marlin_cli {
namespace detail {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSmemPerSm = 160 * 1024;  // shared memory per SM on every GPU built for, rounded down (sm_80: 164 KB)

// How many slices meet_k_warps gets: NK where they fit beside the ring (bytes) for `blocks` blocks per SM, else one.
// One round of stores instead of NK: 8-row chunks, 7B M = 1 -5% (perf-log f1).
constexpr int red_slices(int nk, int ring, int red_bytes, int blocks) {
  return (ring + nk * red_bytes) * blocks <= kSmemPerSm ? nk : 1;
}

// ---------------------------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1 (.cg): B is read once, A comes from L2. No L2 cache hint: with
// nvcc 13.0 on sm_90 the createpolicy + L2::cache_hint form traps at run time (DESIGN.md 6).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// Same, but copies src_bytes (0 or 16) and zero-fills the rest: rows of A past m become zeros without a branch.
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}

// The same two copies to a shared-memory address (smem_addr), so a stage's destinations are one base plus offsets.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// A 4-byte copy (through L1: .cg takes 16 bytes only), to place single words of a chunk.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Programmatic dependent launch (sm_90 and newer; no-ops before). The host launches every kernel with it, so a
// kernel may be started while the previous one in the stream drains; grid_dependency_wait() returns once that one
// has completed and its writes are visible. Before it a GEMM reads only its weights and scales (the first stages'
// copies, pipeline()): a model's weights are written once, when it is loaded, never by the kernel launched just before
// a GEMM (kernels/README.md). allow_dependents() lets the next kernel start; its blocks take SMs as this kernel's
// blocks exit.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Four 8x8 fp16 matrices: exactly the A operand of one m16n8k16 mma.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two 8x8 fp16 matrices (addresses from lanes 0-15): the B operand of one m16n8k16 mma.
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// 16 bytes from a shared-memory address.
__device__ __forceinline__ int4 lds128(uint32_t addr) {
  int4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// 8 and 4 bytes from a shared-memory address.
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void mma_16816(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// (a & mask) | bits in one instruction (LUT 0xea = (F0 & CC) | AA).
template <uint32_t MASK, uint32_t BITS>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(a), "n"(MASK), "n"(BITS));
  return r;
}

// Explicit .rn so ptxas cannot contract a subtract and a following multiply into one differently-rounded fma.
__device__ __forceinline__ uint32_t hsub2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// One packed int32 holds the weights of one lane in two n8 sub-tiles (DESIGN.md 3.1 step 2): nibbles 0,4 = k rows
// 0,1 and nibbles 1,5 = k rows 8,9 of sub-tile 0; nibbles 2,6 and 3,7 the same for sub-tile 1. A low nibble OR-ed
// into the mantissa of fp16 1024.0 (0x6400, unit 1) reads as 1024 + q; a high one (four bits up) OR-ed into HI_EXP
// reads as 1024 + 16q (0x6400) or 64 + q (0x5400, unit 1/16). `lo0, hi0` are sub-tile 0's k rows (0,1) and (8,9),
// `lo1, hi1` sub-tile 1's, each still carrying that offset.
struct Nibbles {
  uint32_t lo0, hi0, lo1, hi1;
};
template <uint32_t HI_EXP>
__device__ __forceinline__ Nibbles nibbles(uint32_t q) {
  constexpr uint32_t kLo = 0x000f000f, kHi = 0x00f000f0, kLoExp = 0x64006400;
  Nibbles r;
  r.lo0 = and_or<kLo, kLoExp>(q);
  r.hi0 = and_or<kHi, HI_EXP>(q);
  q >>= 8;
  r.lo1 = and_or<kLo, kLoExp>(q);
  r.hi1 = and_or<kHi, HI_EXP>(q);
  return r;
}

// One packed int32 -> the B fragments of two n8 sub-tiles with values q - 8: one subtract of 1032 for a low nibble,
// for a high one (1024 + 16q) a multiply by 1/16 and an add of -72 in one fma. Every intermediate is an integer
// below 2048 or an exact power-of-two multiple, so the result is exact. (Subtracting 72 from 64 + q instead is as
// exact and as many instructions, but made the wgmma kernel 6-11% slower: perf-log t1.)
__device__ __forceinline__ void dequant(uint32_t q, uint32_t (&f0)[2], uint32_t (&f1)[2]) {
  constexpr uint32_t kSub = 0x64086408;  // fp16x2 1032
  constexpr uint32_t kMul = 0x2c002c00;  // fp16x2 1/16
  constexpr uint32_t kAdd = 0xd480d480;  // fp16x2 -72
  const Nibbles v = nibbles<0x64006400>(q);
  f0[0] = hsub2(v.lo0, kSub);
  f0[1] = hfma2(v.hi0, kMul, kAdd);
  f1[0] = hsub2(v.lo1, kSub);
  f1[1] = hfma2(v.hi1, kMul, kAdd);
}

// Broadcast the low / high fp16 of a word to both halves. Written as a PTX move (not a byte permute) so that ptxas
// folds it into the consuming f16x2 instruction as an operand selector (.H0_H0 / .H1_H1): no instruction of its own.
__device__ __forceinline__ uint32_t bcast_lo(uint32_t w) {
  uint32_t r;
  asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {l, l};}\n" : "=r"(r) : "r"(w));
  return r;
}
__device__ __forceinline__ uint32_t bcast_hi(uint32_t w) {
  uint32_t r;
  asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {h, h};}\n" : "=r"(r) : "r"(w));
  return r;
}

// dequant, then with grouped scales (SCALED) sub-tile 0 times the low fp16 of s and sub-tile 1 times the high one.
template <bool SCALED>
__device__ __forceinline__ void dequant_scaled(uint32_t q, uint32_t s, uint32_t (&f0)[2], uint32_t (&f1)[2]) {
  dequant(q, f0, f1);
  if (SCALED) {
    const uint32_t s0 = bcast_lo(s), s1 = bcast_hi(s);
    f0[0] = hmul2(f0[0], s0);
    f0[1] = hmul2(f0[1], s0);
    f1[0] = hmul2(f1[0], s1);
    f1[1] = hmul2(f1[1], s1);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Kernel configuration
// ---------------------------------------------------------------------------------------------------------------

// Chunks of 8 rows are computed transposed, C^T = W^T A^T (TRANS): a 16 x 16 weight tile is the mma's A operand and
// the 8 rows of activations its B operand, half the tensor work of a 16-row tile; the weights enter the mma still
// offset (1024 + q, see Nibbles), one mma of a constant tile per k16 tile subtracts the offsets of all columns at
// once, and the group scales multiply the fp32 sums of a warp's k16 tiles of a stage. Per 64 weights a lane
// handles that takes the instructions that dequantize, scale and multiply from 125 to 79. Taller chunks use m16
// tiles of A and scale the dequantized weights: there the same per-weight work is shared by more rows, and the
// transposed form measured slower at 16 rows (perf-log t1).
template <int ROWS_, int NS_, int KT_, int STAGES_>
struct Cfg {
  static constexpr int R = ROWS_;         // rows of the A / C tile (one chunk of m)
  static constexpr int NS = NS_;          // 64-column strips per block tile
  static constexpr int KT = KT_;          // k16 tiles per pipeline stage
  static constexpr int DEPTH = 16 * KT;   // k per tile
  static constexpr int STAGES = STAGES_;  // depth of the cp.async ring
  static constexpr int THREADS = kThreads;
  static constexpr int NK = kWarps / NS;  // warps sharing one strip (they split each stage's k16 tiles)
  static constexpr int KQ = KT / NK;      // k16 tiles per warp per stage
  static constexpr bool TRANS = R == 8;
  static constexpr int TILES = TRANS ? 1 : R / 16;  // m16 row tiles (TRANS: one n8 tile)
  static constexpr int SUB = TRANS ? 4 : 8;  // accumulator tiles per row tile and 64 columns
  static constexpr int W = 64 * NS;       // columns of the block tile
  static constexpr int A_CHUNKS = 2 * KT;  // 16-byte chunks per A row per stage
  static constexpr bool A_PANELS = false;  // the A tile row-major (StageLoader)
  // Tiles whose weights pipeline() issues before the wait for the previous kernel: all of the prologue's, up to 3
  // (against one: 7B m = 1-8 -3%, 70B -1 to -4%; the wgmma kernels lost 2-13% so, with their activations by tensor
  // copies too, and keep one: perf-log pw2, pt1).
  static constexpr int AHEAD = STAGES - 1 < 3 ? STAGES - 1 : 3;
  static constexpr int A_STAGE = R * A_CHUNKS;   // int4 per stage
  static constexpr int B_STAGE = KT * NS * 32;   // int4 per stage (one per lane per k16 tile per strip)
  static constexpr int S_ROWS = KT / 2;          // most scale rows one stage can span (group size 32)
  static constexpr int S_STAGE = S_ROWS * NS * 8;  // int4 per stage
  static constexpr int STAGE = A_STAGE + B_STAGE + S_STAGE;
  // floats per row of the reduction tile; the pad makes the k warps' stores conflict-free: float2 stores of rows g
  // (+ 8 banks per row), or in TRANS scalar stores of rows 2t (+ 4 banks per row)
  static constexpr int RED_STRIDE = W + (TRANS ? 4 : 8);
  static constexpr int RED = R * RED_STRIDE;  // floats
  // Short chunks fit two blocks per SM (<= 128 registers): the second block computes while the first waits at its
  // per-stage barrier, which a single block of 8 warps cannot hide.
  static constexpr int MIN_BLOCKS = R <= 32 ? 2 : 1;
  static constexpr int RING = STAGES * STAGE * 16;
  static constexpr int RED_SLICES = red_slices(NK, RING, RED * 4, MIN_BLOCKS);  // meet_k_warps
  static constexpr int SMEM = RING + RED_SLICES * RED * 4;
  static_assert(NK * NS == kWarps, "warps must tile the block");
  static_assert(KQ * NK == KT, "k warps must split a stage evenly");
  static_assert(TRANS || R % 16 == 0, "whole row tiles");
  static_assert(R * W <= kMaxTileElems, "partial tiles must fit their workspace slot");
};

struct Params {
  const int4* a;    // first row of this launch's chunks
  const int4* b;
  const int4* s;
  int4* c;          // first row of this launch's chunks
  float* partials;  // parts of split column strips: two slots per block (part_slot)
  int m;            // rows left from this launch's first row
  int n, k;
  int lg_group;     // log2(group size / depth of a k tile: 16 dense, 32 for 2:4); unused for one group
  int blocks_per_chunk;
  bool early_dependents;  // the grid takes every block slot: the next kernel may start at once (pipeline())
  int* flags;  // non-null: the blocks add split strips' parts themselves (warp-specialized kernels, own_parts())
};

// log2(group / unit), the number of k tiles of `unit` rows that share one scale row as a power of two, for the
// group sizes the kernels take (32, 64, 128), or -1 for any other (host side; the 2:4 launcher uses it too).
inline int group_lg(int k, int groups, int unit) {
  if (groups < 1 || k % groups) return -1;
  const int group = k / groups;
  if (group != 32 && group != 64 && group != 128) return -1;
  int lg = 0;
  while ((unit << lg) < group) ++lg;
  return lg;
}

// ---------------------------------------------------------------------------------------------------------------
// Loading one pipeline stage (both dense kernels)
// ---------------------------------------------------------------------------------------------------------------

// The wgmma kernels' A tile as 64-deep panels of ROWS rows one after another, each the 128-byte swizzle wgmma
// reads: the int4 where chunk j (8 per panel row) of row r lands (StageLoader, sparse24::Sm90Loader; a_panel_desc).
template <int ROWS>
__device__ __forceinline__ int a_panel_chunk(int r, int j) {
  return (j / 8) * ROWS * 8 + r * 8 + ((j % 8) ^ (r % 8));
}

// What a loader's load(st, what, kt) copies into the stage at st: kAll, its next tile's weights (codes, 2:4
// metadata, scales) and activations, or kWeights, the weights alone, then either way moves on to the tile after;
// kActs, the activations of k-tile kt by cp.async; kActsNow (StageLoader only), those of the AHEAD tiles from k-tile
// kt into the ring's first stages by plain loads and stores (prologue_acts). pipeline()'s prologue issues weights
// before the wait for the previous kernel and the activations of those tiles after it (kActs for one tile, kActsNow
// for more).
enum class Copies { kWeights, kActs, kAll, kActsNow };

// kActsNow's copies: copy i < N of stage s < S (STAGE_BYTES apart from st) stores src(kt_s, i) at dst(i), zeros where
// src gives nullptr and nothing where has(i) is false; kt_s is the stage's k-tile, kt + s wrapped at k_tiles. Every
// load is issued before the first store.
template <int S, int N, uint32_t STAGE_BYTES, class Has, class Src, class Dst>
__device__ __forceinline__ void prologue_acts(uint32_t st, int kt, int k_tiles, Has&& has, Src&& src, Dst&& dst) {
  int4 v[S][N];
#pragma unroll
  for (int s = 0; s < S; ++s) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int4* from = has(i) ? src(kt, i) : nullptr;
      v[s][i] = from ? __ldcg(from) : make_int4(0, 0, 0, 0);
    }
    if (++kt == k_tiles) kt = 0;
  }
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (has(i)) {
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(st + s * STAGE_BYTES + dst(i)),
                     "r"(v[s][i].x), "r"(v[s][i].y), "r"(v[s][i].z), "r"(v[s][i].w)
                     : "memory");
      }
    }
}

// A stage holds, from its first byte: the A tile (R rows x A_CHUNKS 16-byte chunks), the packed weights (KT rows x
// NS strips x 32 lanes of 16 bytes, in copy order, so a lane later reads its own 16 bytes) and the scale rows the
// stage spans. Every thread's share of a stage is fixed: only the tile's (column strip, k-tile) base moves. The
// per-thread parts are computed once; the bases of the next stage to load live in registers and advance by
// additions, so a stage's copies cost no index arithmetic beyond one add per pointer. Shared-memory destinations
// are byte offsets from the slot's address.
template <class C, bool GROUPED>
struct StageLoader {
  static constexpr int B_PASS = C::THREADS / (C::NS * 32);
  static constexpr int A_PER = (C::A_STAGE + C::THREADS - 1) / C::THREADS;
  static_assert(C::B_STAGE % C::THREADS == 0, "every thread copies the same number of B chunks");
  static_assert(C::A_CHUNKS >= 8, "the A swizzle XORs three bits of the chunk index");

  const int4* b;
  const int4* s;
  const int4* a_g;
  int k_tiles, b_row, s_row;
  // B: thread tid copies rows tid / (NS * 32) + i * B_PASS, column tid % (NS * 32).
  int64_t b_thr, b_pass, b_stage;
  uint32_t b_dst;
  // A: chunk j of row r lands at r * A_CHUNKS + (j ^ (r % 8)), so the 8 rows one ldmatrix phase reads fall in 8
  // different 16-byte bank groups (and a 64-deep stage is exactly the 128-byte swizzle of a wgmma operand). With
  // A_PANELS (the wgmma kernels) a deeper stage is A_CHUNKS / 8 such 64-deep panels of R rows one after another
  // (a_panel_chunk). Rows past m are zero-filled (no global read).
  // Pass i copies row r0 + i * A_ROWS (chunk j stays, so does r % 8: the destinations are a_dst + i * A_PASS).
  static constexpr int A_ROWS = C::THREADS / C::A_CHUNKS;
  static constexpr uint32_t A_PASS = (C::A_PANELS ? A_ROWS * 8 : C::THREADS) * 16;
  static_assert(C::THREADS % C::A_CHUNKS == 0 && A_ROWS % 8 == 0, "every pass keeps a thread's chunk and swizzle");
  int a_src, a_pass, a_rows;  // source offset of pass 0, added per pass; rows left from r0 (pass i is real below)
  uint32_t a_dst;
  // Scales: the group rows a stage spans (one row when a group spans several stages), NS * 8 int4 each. The row of
  // the next stage is ld_g8 / 8 (ld_g8 counts group rows times 8, exact for any group).
  bool s_copy;
  int s_thr, s_stage_rows;
  uint32_t s_dst;
  // Next tile to load: its column strip and k-tile, and the matching bases.
  int ld_col, ld_kt, ld_a, ld_g8;
  const int4* ld_b;
  const int4* ld_s;

  __device__ __forceinline__ StageLoader(const Params& p, const int4* a_chunk, int m_rows, int t_begin, int tiles)
      : b(p.b), s(p.s), a_g(a_chunk), k_tiles(tiles), b_row(p.n / 2), s_row(p.n / 8) {
    const int tid = threadIdx.x;
    const int a_row = p.k / 8;  // int4 per A row
    b_thr = static_cast<int64_t>(tid / (C::NS * 32)) * b_row + tid % (C::NS * 32);
    b_pass = static_cast<int64_t>(B_PASS) * b_row;
    b_stage = static_cast<int64_t>(C::KT) * b_row;
    b_dst = (C::A_STAGE + tid) * 16;
    {
      const int r = tid / C::A_CHUNKS, j = tid % C::A_CHUNKS;
      a_src = r * a_row + j;
      a_pass = A_ROWS * a_row;
      a_rows = m_rows - r;
      a_dst = (C::A_PANELS ? a_panel_chunk<C::R>(r, j) : r * C::A_CHUNKS + (j ^ (r % 8))) * 16;
    }
    const int s_rows = max(1, C::KT >> p.lg_group);
    s_copy = GROUPED && tid < s_rows * C::NS * 8;
    s_thr = (tid / (C::NS * 8)) * s_row + tid % (C::NS * 8);
    s_stage_rows = (C::KT << 3) >> p.lg_group;
    s_dst = (C::A_STAGE + C::B_STAGE + tid) * 16;
    ld_col = t_begin / k_tiles;
    ld_kt = t_begin - ld_col * k_tiles;
    ld_b = b + static_cast<int64_t>(ld_kt) * b_stage + ld_col * C::NS * 32 + b_thr;
    ld_a = ld_kt * C::A_CHUNKS;
    ld_s = s + ld_col * C::NS * 8 + s_thr;
    ld_g8 = ld_kt * s_stage_rows;
  }

  // Issues the copies `what` (Copies) into the stage at shared-memory address st; kt: kActs' k-tile, kActsNow's first.
  __device__ __forceinline__ void load(uint32_t st, Copies what = Copies::kAll, int kt = 0) {
    const int tid = threadIdx.x;
    auto has = [&](int i) { return C::A_STAGE % C::THREADS == 0 || tid + i * C::THREADS < C::A_STAGE; };
    auto real = [&](int i) { return i * A_ROWS < a_rows; };  // rows past m: zero-filled, without a global read
    if constexpr (C::AHEAD > 1) {
      if (what == Copies::kActsNow) {
        prologue_acts<C::AHEAD, A_PER, C::STAGE * 16>(
            st, kt, k_tiles, has,
            [&](int kt_s, int i) { return real(i) ? a_g + (kt_s * C::A_CHUNKS + a_src + i * a_pass) : nullptr; },
            [&](int i) { return a_dst + i * A_PASS; });
        return;
      }
    }
    const bool weights = what != Copies::kActs, acts = what != Copies::kWeights;
    const int a_tile = what == Copies::kActs ? kt * C::A_CHUNKS : ld_a;
    if (weights) {
#pragma unroll
      for (int i = 0; i < C::B_STAGE / C::THREADS; ++i) cp_async16(st + b_dst + i * C::THREADS * 16, ld_b + i * b_pass);
    }
    if (acts) {
#pragma unroll
      for (int i = 0; i < A_PER; ++i) {
        if (has(i)) {  // the source clamped to row 0 where not real
          cp_async16_zfill(st + a_dst + i * A_PASS, a_g + (a_tile + (real(i) ? a_src + i * a_pass : 0)),
                           real(i) ? 16 : 0);
        }
      }
    }
    if (weights && s_copy) cp_async16(st + s_dst, ld_s + (ld_g8 >> 3) * s_row);  // int: below the scales' int4 count
    if (!weights) return;
    if (++ld_kt == k_tiles) {
      ld_kt = 0;
      ++ld_col;
      ld_b = b + ld_col * C::NS * 32 + b_thr;
      ld_a = 0;
      ld_s = s + ld_col * C::NS * 8 + s_thr;
      ld_g8 = 0;
    } else {
      ld_b += b_stage;
      ld_a += C::A_CHUNKS;
      ld_g8 += s_stage_rows;
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Writing one column strip's result (the 2:4 kernel uses it too)
// ---------------------------------------------------------------------------------------------------------------

// A quad of four values of a part: fp32, or fp16 (4 halves, 8 bytes) where HALF (kHalfParts).
template <bool HALF>
using PartQuad = std::conditional_t<HALF, uint2, float4>;
// A quad added to v in fp32; fp16 ones half by half: through __half2 conversions ptxas spilled up to 592 bytes in the
// dense warp-specialized kernels with per-channel scales (perf-log h16).
__device__ __forceinline__ void add_quad(float* v, float4 x) { v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w; }
__device__ __forceinline__ void add_quad(float* v, uint2 x) {
  v[0] += __half2float(__ushort_as_half(static_cast<unsigned short>(x.x)));
  v[1] += __half2float(__ushort_as_half(static_cast<unsigned short>(x.x >> 16)));
  v[2] += __half2float(__ushort_as_half(static_cast<unsigned short>(x.y)));
  v[3] += __half2float(__ushort_as_half(static_cast<unsigned short>(x.y >> 16)));
}
// Four fp32 values as a part of quads Q saves them.
template <class Q>
__device__ __forceinline__ Q make_quad(float a, float b, float c, float d) {
  if constexpr (std::is_same_v<Q, float4>) {
    return make_float4(a, b, c, d);
  } else {
    const __half2 lo = __floats2half2_rn(a, b), hi = __floats2half2_rn(c, d);
    return make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
}

// The end of a run inside one column strip for a tile met in shared memory (both mma.sync kernels): each of its
// `entries` 8-column entries (entry e is in row e / PER_ROW; rows from m_rows on are skipped) is read by gather(e, v)
// and written to C by store(e, v), or, when the run holds only part of the strip, saved row-major to `part`
// (segment_part) for add_parts_kernel (RowParts).
template <int THREADS, int PER_ROW, class Gather, class Store>
__device__ __forceinline__ void write_strip(float* part, int entries, int m_rows, Gather&& gather, Store&& store) {
  for (int e = threadIdx.x; e < entries; e += THREADS) {
    if (e / PER_ROW >= m_rows) continue;
    float v[8];
    gather(e, v);
    if (part == nullptr) {
      store(e, v);
    } else {
      float4* dst = reinterpret_cast<float4*>(part + e * 8);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

// The k warps' partial tiles of a block meet in shared memory at the end of a run. With SLICES == NK every k warp
// stores its tile into its own slice (`slice` floats apart) in one round, and the reader adds the slices (met());
// with SLICES == 1 they add into one tile one k warp after another, a block barrier each. Both sum in k-warp
// order, so results are reproducible and the same either way. put(tile, first) stores the warp's values into tile
// (first) or adds them.
template <int NK, int SLICES, class Put>
__device__ __forceinline__ void meet_k_warps(float* red, int slice, int k_warp, Put&& put) {
  float* const mine = red + (SLICES > 1 ? k_warp * slice : 0);
#pragma unroll 1
  for (int kw = 0; kw < NK; kw += SLICES) {
    if (SLICES > 1 || k_warp == kw) put(mine, SLICES > 1 || kw == 0);
    __syncthreads();
  }
}

// Element src of the met tile.
template <int SLICES>
__device__ __forceinline__ float met(const float* src, int slice) {
  float v = src[0];
#pragma unroll
  for (int s = 1; s < SLICES; ++s) v += src[s * slice];
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Partition and main loop (all three kernels)
// ---------------------------------------------------------------------------------------------------------------

// The run of tiles a block takes: the tiles of one chunk of `rows` rows are numbered column strip by column strip
// (`cols` wide; k fastest, `depth` rows of K per tile) and every block of the chunk takes one contiguous run.
struct Run {
  int chunk, bid;              // the block's chunk of rows, and its index among the chunk's blocks
  int m_rows;                  // rows of the chunk that exist
  int n_cols, k_tiles, iters;  // column strips, tiles per strip, tiles per run
  int t_begin, n_iter;         // the block's first tile and its number of tiles
};

// A tile of a run: column strip col, k tile kt (of k_tiles per strip). next() steps to the run's next tile, the next
// strip's first after a strip's last.
struct TilePos {
  int col, kt;
  __device__ __forceinline__ TilePos(int t, int k_tiles) : col(t / k_tiles), kt(t - t / k_tiles * k_tiles) {}
  __device__ __forceinline__ void next(int k_tiles) {
    if (++kt == k_tiles) {
      kt = 0;
      ++col;
    }
  }
};

// Tiles per run when `blocks` blocks share `total` tiles (the last runs may be shorter or empty).
__host__ __device__ __forceinline__ int tiles_per_run(int total, int blocks) { return (total + blocks - 1) / blocks; }

// Fills r; false when the block has nothing to do (its chunk is past m, or its run past the last tile).
__device__ __forceinline__ bool plan_run(int m, int n, int k, int rows, int cols, int depth, int blocks_per_chunk,
                                         Run& r) {
  r.chunk = blockIdx.x / blocks_per_chunk;
  r.bid = blockIdx.x % blocks_per_chunk;
  r.m_rows = min(rows, m - r.chunk * rows);
  if (r.m_rows <= 0) return false;
  r.n_cols = n / cols;
  r.k_tiles = k / depth;
  const int total = r.n_cols * r.k_tiles;
  r.iters = tiles_per_run(total, blocks_per_chunk);
  r.t_begin = r.bid * r.iters;
  r.n_iter = min(total, r.t_begin + r.iters) - r.t_begin;
  return r.n_iter > 0;
}

// ---------------------------------------------------------------------------------------------------------------
// Split column strips: the GEMM kernels save the parts, add_parts_kernel adds them after the launch (all kernels)
// ---------------------------------------------------------------------------------------------------------------

// Whether a launch leaves column strips in parts: blocks take runs of `iters` of the n_cols * k_tiles tiles
// (plan_run), and a run boundary inside a strip splits it.
inline bool splits_strips(int blocks_per_chunk, int n_cols, int k_tiles) {
  const int total = n_cols * k_tiles;
  const int iters = tiles_per_run(total, blocks_per_chunk);
  return iters < total && iters % k_tiles != 0;
}

// Whether a warp-specialized kernel's blocks add split strips' parts themselves: where runs are at least a third of a
// strip long. Its launches hold at most one block per SM (sm90_blocks_per_chunk), so all of them are resident at once
// and may wait for each other. A strip's first part is its block's last segment and every later part its block's
// first, so where runs are long the later parts are saved long before the first one's block needs them; with shorter
// runs (more parts per strip, each finishing with the launch) one block reading them all lost to add_parts_kernel,
// which spreads that work over the GPU (perf-log f3).
inline bool own_parts(int blocks_per_chunk, int n_cols, int k_tiles) {
  return 3 * tiles_per_run(n_cols * k_tiles, blocks_per_chunk) >= k_tiles;
}

// Workspace slot (`elems` floats: one R x W tile) of block b's part of the strip that starts at tile strip_begin:
// slot 0 of the block's pair when the part is its run's first segment, 1 when it is its last.
__device__ __forceinline__ float* part_slot(float* partials, int elems, int first_block, int iters, int strip_begin,
                                            int b) {
  const int s = b * iters >= strip_begin ? 0 : 1;
  return partials + (static_cast<int64_t>(first_block + b) * 2 + s) * elems;
}

// Where a run's segment [seg_begin, seg_end) of column strip col goes: nullptr when it covers the whole strip (the
// block writes C), else the block's slot for its part of the strip.
__device__ __forceinline__ float* segment_part(const Params& p, const Run& r, int elems, int col, int seg_begin,
                                               int seg_end) {
  const int strip_begin = col * r.k_tiles;
  if (seg_begin == strip_begin && seg_end == strip_begin + r.k_tiles) return nullptr;
  return part_slot(p.partials, elems, r.chunk * p.blocks_per_chunk, r.iters, strip_begin, r.bid);
}

// Column x's per-channel scale in the dense layout's permuted order (3.1 step 4: within 32 columns, column
// 8q + 2i + b sits at 8i + 2q + b).
__host__ __device__ __forceinline__ int permuted_scale(int x) {
  const int r = x & 31;
  return (x & ~31) + 8 * ((r & 7) >> 1) + 2 * (r >> 3) + (r & 1);
}

// The sums v of columns n0 .. n0 + 7 of a row as 8 fp16 (16 bytes of C), times their per-channel scales s unless
// GROUPED: stored as permuted_scale says (PERMUTED, dense) or in column order (2:4); either way columns n0 + 2i and
// n0 + 2i + 1 sit side by side (n0 % 8 == 0).
template <bool GROUPED, bool PERMUTED>
__device__ __forceinline__ int4 scaled_row8(const float (&v)[8], const void* s, int n0) {
  float f[8];
#pragma unroll
  for (int x = 0; x < 8; ++x) f[x] = v[x];
  if (!GROUPED) {
    const __half2* s2 = reinterpret_cast<const __half2*>(s);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 sv = __half22float2(s2[PERMUTED ? permuted_scale(n0 + 2 * i) / 2 : n0 / 2 + i]);
      f[2 * i] *= sv.x;
      f[2 * i + 1] *= sv.y;
    }
  }
  __half2 h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
  return *reinterpret_cast<int4*>(h);
}

// How the mma.sync kernels save a part (write_strip): the R x W tile of config C row-major. For add_parts_kernel
// (which takes a part's 8-row bands) thread t adds float4 t of a band: row t / (W / 4), columns 4 (t % (W / 4)) + e,
// which it writes to C itself (not STAGED). Per-channel scales are permuted (dense) or in column order (2:4).
template <class C, bool PERMUTED>
struct RowParts {
  static constexpr int R = C::R, W = C::W, DEPTH = C::DEPTH, THREADS = 2 * W, MAX_SPLIT = 1;
  static constexpr bool STAGED = false;
  using Quad = PartQuad<false>;
  static __device__ __forceinline__ int thread(int s, int, int) { return s; }
  static __device__ __forceinline__ int64_t at(int band, int t) { return band * 2 * W + t; }
  static __device__ __forceinline__ int row(int t, int) { return t / (W / 4); }
  static __device__ __forceinline__ int col(int t, int e) { return 4 * (t % (W / 4)) + e; }
  static __device__ __forceinline__ int scale(int x) { return PERMUTED ? permuted_scale(x) : x; }
};

// The split strips of a launch, added up after it on the same stream (it waits for the launch to complete): the GEMM's
// blocks only save their parts, and the sums are spread over the whole GPU. Before, the block that completed a strip's
// count added the parts alone, after a fence and an atomic (perf-log a1, q1). Block (chunk, col, band) takes rows 8
// band .. 8 band + 7 of strip col, in SPLIT blocks (1 or L::MAX_SPLIT) of W / SPLIT columns each. L, the parts' layout
// (RowParts, RegisterParts): L::THREADS threads a band; thread s of the block for columns [h W / SPLIT, (h + 1) W /
// SPLIT) is the band's thread t = L::thread(s, h, SPLIT), which adds quad L::at(band, t) of each part (L::Quad) in
// block order (so results do not depend on timing); its four sums are element (L::row(t, e), L::col(t, e)) of the band,
// scaled per channel by the scale at L::scale(column). Where a thread's four are not consecutive columns of a row
// (L::STAGED), they meet as fp16 in shared memory and go to C in 16-byte row chunks. Threads whose values are all in
// rows past m load nothing. Where the GEMM's grid took every block slot (p.early_dependents), the next kernel may start
// as soon as this one's blocks all run: its blocks take the SMs the GEMM leaves and read their first weights while the
// parts are added (its own wait covers this kernel, which waits for the GEMM). Beside a smaller grid they would start
// on the free slots at once, as pipeline() says, so there the next kernel starts once the GEMM is done (perf-log pd1).
template <class L, bool GROUPED, int SPLIT>
__global__ void __launch_bounds__(L::THREADS / SPLIT) add_parts_kernel(const Params p) {
  if (p.early_dependents) allow_dependents();
  grid_dependency_wait();
  if (!p.early_dependents) allow_dependents();
  constexpr int kW = L::W / SPLIT;  // the block's columns
  const int n_cols = p.n / L::W;
  const int h = blockIdx.x % SPLIT, band = blockIdx.x / SPLIT % (L::R / 8);
  const int col = blockIdx.x / SPLIT / (L::R / 8) % n_cols;
  const int chunk = blockIdx.x / SPLIT / (L::R / 8) / n_cols;
  const int rows = min(L::R, p.m - chunk * L::R) - 8 * band;  // rows of this band that exist
  const int k_tiles = p.k / L::DEPTH;
  const int iters = tiles_per_run(n_cols * k_tiles, p.blocks_per_chunk);
  const int strip_begin = col * k_tiles;
  const int bid_lo = strip_begin / iters, bid_hi = (strip_begin + k_tiles - 1) / iters;
  if (rows <= 0 || bid_lo == bid_hi) return;  // no rows, or the run that held the whole strip wrote it

  const int t = L::thread(threadIdx.x, h, SPLIT);
  bool mine = false;  // some of the thread's values are in rows that exist
#pragma unroll
  for (int e = 0; e < 4; ++e) mine |= L::row(t, e) < rows;
  const int64_t at = L::at(band, t);
  const int first_block = chunk * p.blocks_per_chunk;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  constexpr int kInFlight = 8;
  for (int b0 = bid_lo; mine && b0 <= bid_hi; b0 += kInFlight) {
    using Quad = typename L::Quad;
    Quad x[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      if (b0 + q <= bid_hi) {
        x[q] = __ldcg(reinterpret_cast<const Quad*>(
                          part_slot(p.partials, L::R * L::W, first_block, iters, strip_begin, b0 + q)) +
                      at);
      }
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      if (b0 + q <= bid_hi) add_quad(v, x[q]);
    }
  }
  alignas(8) __half out[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int x = L::col(t, e);
    const float s = GROUPED ? 1.f : __half2float(reinterpret_cast<const __half*>(p.s)[L::scale(col * L::W + x)]);
    out[e] = __float2half_rn(v[e] * s);
  }
  __half* const c = reinterpret_cast<__half*>(p.c) + (static_cast<int64_t>(chunk) * L::R + 8 * band) * p.n + col * L::W;
  if constexpr (!L::STAGED) {
    if (mine) {
      *reinterpret_cast<uint2*>(c + static_cast<int64_t>(L::row(t, 0)) * p.n + L::col(t, 0)) =
          *reinterpret_cast<const uint2*>(out);
    }
  } else {
    constexpr int kPad = 8;  // halves: spreads the rows' 2-byte stores over the banks
    __shared__ alignas(16) __half rows8[8][kW + kPad];
#pragma unroll
    for (int e = 0; e < 4; ++e) rows8[L::row(t, e)][L::col(t, e) - h * kW] = out[e];
    __syncthreads();
    for (int e = threadIdx.x; e < 8 * (kW / 8); e += L::THREADS / SPLIT) {
      const int r = e / (kW / 8), q = e % (kW / 8);
      if (r < rows) {
        *reinterpret_cast<int4*>(c + static_cast<int64_t>(r) * p.n + h * kW + 8 * q) =
            *reinterpret_cast<const int4*>(&rows8[r][8 * q]);
      }
    }
  }
}

// The main loop: a STAGES-deep ring of stages at shared-memory addresses ring + i * STAGE_BYTES, one cp.async
// commit per iteration (empty ones included). It starts with the programmatic-dependent-launch handshake: the next
// kernel may start at once when this grid takes every block slot (`early_dependents`: its blocks then only get the
// SMs this kernel's blocks leave; with slots free they would start beside this kernel's blocks, and some SMs would
// later run two of them while others ran one: 7B layers with n = 4096 at m = 64, +18%), then the wait for the
// previous kernel, with the weights of the first AHEAD tiles already in flight, so that they stream in while that
// kernel drains. With one tile ahead its activations join its cp.async group after the wait (with more tiles in that
// group the first compute waited for all of them: perf-log pw1). With more, each tile's weights are a group of their
// own and their activations are copied by plain loads and stores once the rest of the prologue is issued (perf-log
// pw2). load(st, what, kt) issues copies (Copies) into stage st;
// ready() runs once the current stage has landed for this thread, before the block barrier; compute(st) consumes
// it; finish(col, seg_begin, seg_end) ends the part of the run inside column strip col (at a strip's last tile and
// at the run's last). One copy of the loop body: unrolling it over the ring (static slot addresses) made a 160 KB
// kernel that ran out of the instruction cache (v1); the slot addresses are registers advanced once per stage.
template <int STAGES, uint32_t STAGE_BYTES, int AHEAD = 1, class Load, class Ready, class Compute, class Finish>
__device__ __forceinline__ void pipeline(const Run& r, uint32_t ring, bool early_dependents, Load&& load, Ready&& ready,
                                         Compute&& compute, Finish&& finish) {
  static_assert(AHEAD >= 1 && AHEAD < STAGES, "the tiles ahead are prologue tiles");
  const uint32_t ring_end = ring + STAGES * STAGE_BYTES;
  if (early_dependents) allow_dependents();
  if constexpr (AHEAD == 1) {
    load(ring, Copies::kWeights, 0);  // every run has a tile (plan_run)
    grid_dependency_wait();
    load(ring, Copies::kActs, r.t_begin % r.k_tiles);
    cp_async_commit();
  } else {
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
      if (s < r.n_iter) load(ring + s * STAGE_BYTES, Copies::kWeights, 0);
      cp_async_commit();
    }
    grid_dependency_wait();
  }
#pragma unroll
  for (int s = AHEAD; s < STAGES - 1; ++s) {
    if (s < r.n_iter) load(ring + s * STAGE_BYTES, Copies::kAll, 0);
    cp_async_commit();
  }
  // last, since each thread waits here for its loads; stages past the run's tiles take activations they never use
  if constexpr (AHEAD > 1) load(ring, Copies::kActsNow, r.t_begin % r.k_tiles);
  int seg_begin = r.t_begin;
  uint32_t slot = ring, slot_next = ring + (STAGES - 1) * STAGE_BYTES;
  int cur_col = r.t_begin / r.k_tiles;
  int cur_kt = r.t_begin - cur_col * r.k_tiles;
#pragma unroll 1
  for (int it = 0; it < r.n_iter; ++it) {
    cp_async_wait<STAGES - 2>();  // stage `it` has landed
    ready();
    __syncthreads();  // ... for every thread, and every thread is done with stage it - 1
    if (it + STAGES - 1 < r.n_iter) load(slot_next, Copies::kAll, 0);
    cp_async_commit();
    compute(slot);
    slot = slot + STAGE_BYTES == ring_end ? ring : slot + STAGE_BYTES;
    slot_next = slot_next + STAGE_BYTES == ring_end ? ring : slot_next + STAGE_BYTES;
    const bool strip_end = ++cur_kt == r.k_tiles;
    if (strip_end || it + 1 == r.n_iter) {
      const int tile = r.t_begin + it;
      finish(cur_col, seg_begin, tile + 1);
      seg_begin = tile + 1;
    }
    if (strip_end) {
      cur_kt = 0;
      ++cur_col;
    }
  }
  cp_async_wait<0>();
}

// pipeline()'s load(st, what, kt) for a loader with load(st, what, kt).
template <class L>
__device__ __forceinline__ auto loader_load(L& loader) {
  return [&loader](uint32_t st, Copies what, int kt) { loader.load(st, what, kt); };
}

// ---------------------------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------------------------

template <class C, bool GROUPED>
__global__ void __launch_bounds__(kThreads, C::MIN_BLOCKS) gemm_kernel(const Params p) {
  extern __shared__ int4 smem[];
  float* red = reinterpret_cast<float*>(smem + C::STAGES * C::STAGE);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int n_warp = warp % C::NS;  // which 64-column strip
  const int k_warp = warp / C::NS;  // which slice of each stage's k16 tiles

  Run run;
  if (!plan_run(p.m, p.n, p.k, C::R, C::W, C::DEPTH, p.blocks_per_chunk, run)) return;
  const int chunk = run.chunk, m_rows = run.m_rows, k_tiles = run.k_tiles;

  const int4* a_g = p.a + static_cast<int64_t>(chunk) * C::R * (p.k / 8);
  int4* c_g = p.c + static_cast<int64_t>(chunk) * C::R * (p.n / 8);

  StageLoader<C, GROUPED> loader(p, a_g, m_rows, run.t_begin, k_tiles);

  // --- per-thread shared-memory byte offsets within a stage, fixed for the whole kernel ------------------------
  // A fragments of the warp's k16 tile q. m16 tiles (ldmatrix.x4, mma operand A): lanes 0-15 address rows 0-15 at
  // k 0-7, lanes 16-31 rows 0-15 at k 8-15. TRANS (ldmatrix.x2, operand B): lanes 0-7 rows 0-7 at k 0-7, lanes 8-15
  // rows 0-7 at k 8-15 (lanes 16-31 repeat them; x2 ignores their addresses).
  uint32_t a_off[C::KQ];
#pragma unroll
  for (int q = 0; q < C::KQ; ++q) {
    const int r = C::TRANS ? lane % 8 : lane % 16;
    const int j = 2 * (k_warp * C::KQ + q) + (C::TRANS ? (lane / 8) % 2 : lane / 16);
    a_off[q] = (r * C::A_CHUNKS + (j ^ (r % 8))) * 16;
  }
  constexpr uint32_t a_tile = 16 * C::A_CHUNKS * 16;  // bytes from one m16 row tile to the next
  const uint32_t b_off = (C::A_STAGE + (k_warp * C::KQ * C::NS + n_warp) * 32 + lane) * 16;
  // Grouped scales: 8 fp16 per lane = the scales of its column in the strip's eight n8 sub-tiles (3.1 step 4). A
  // warp's KQ <= 2 k16 tiles start at a multiple of KQ and the smallest group is two k16 tiles, so they share one
  // group row: one load per stage.
  static_assert(C::KQ <= 2, "a warp's k16 tiles of a stage must share one group (32 rows)");
  const uint32_t s_off =
      (C::A_STAGE + C::B_STAGE + ((k_warp * C::KQ) >> p.lg_group) * C::NS * 8 + n_warp * 8 + lane / 4) * 16;

  // TILES row tiles x SUB accumulator tiles x 4: independent chains, one per mma; zeroed at the start of every run.
  // Element e of tile (i, j) of lane (g, t) (g = lane / 4, t = lane % 4) is, in the warp's 64 columns:
  //   m16 tiles: row 16i + g (+ 8 for e >= 2), column 8j + 2t + e % 2 (j: n8 sub-tile);
  //   TRANS:     row 2t + e % 2, column 16j + g (+ 8 for e >= 2) (j: 16x16 weight tile = sub-tiles 2j, 2j + 1).
  float acc[C::TILES][C::SUB][4];
  auto zero_acc = [&] {
#pragma unroll
    for (int i = 0; i < C::TILES; ++i)
#pragma unroll
      for (int j = 0; j < C::SUB; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  };
  zero_acc();

  auto compute_stage = [&](uint32_t st) {
    int4 sc = make_int4(0, 0, 0, 0);
    if (GROUPED) sc = lds128(st + s_off);
    const uint32_t sw[4] = {static_cast<uint32_t>(sc.x), static_cast<uint32_t>(sc.y),
                            static_cast<uint32_t>(sc.z), static_cast<uint32_t>(sc.w)};
    if constexpr (C::TRANS) {
      // Each mma sums (1024 + q) a over a tile's k rows 0-7 and (64 + q) a over rows 8-15 (nibbles<0x5400>);
      // starting the sums from a constant tile's product (-1032 on rows 0-7, -72 on rows 8-15) leaves (q - 8) a. The
      // fp16 products are exact; the fp32 sums are up to ~1000 times the result, which costs ~10 of fp32's 24 bits.
      constexpr uint32_t kOffset[4] = {0xe408e408, 0xe408e408, 0xd480d480, 0xd480d480};  // -1032, -72
      uint32_t bf[C::KQ][2], bw[C::KQ][4];
      float base[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q = 0; q < C::KQ; ++q) {
        ldmatrix_x2(bf[q], st + a_off[q]);
        mma_16816(kOffset, bf[q], base);
        const int4 v = lds128(st + b_off + q * C::NS * 32 * 16);
        bw[q][0] = v.x, bw[q][1] = v.y, bw[q][2] = v.z, bw[q][3] = v.w;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // weight tile j: sub-tile 2j in its rows 0-7, 2j + 1 in rows 8-15
        float d[4] = {base[0], base[1], base[2], base[3]};
#pragma unroll
        for (int q = 0; q < C::KQ; ++q) {
          const Nibbles v = nibbles<0x54005400>(bw[q][j]);
          const uint32_t wf[4] = {v.lo0, v.lo1, v.hi0, v.hi1};
          mma_16816(wf, bf[q], d);
        }
        float2 sv = make_float2(1.f, 1.f);  // the scales of rows g and g + 8
        if (GROUPED) sv = __half22float2(*reinterpret_cast<const __half2*>(&sw[j]));
        acc[0][j][0] += sv.x * d[0];
        acc[0][j][1] += sv.x * d[1];
        acc[0][j][2] += sv.y * d[2];
        acc[0][j][3] += sv.y * d[3];
      }
    } else {
#pragma unroll
      for (int q = 0; q < C::KQ; ++q) {
        uint32_t a[C::TILES][4];
#pragma unroll
        for (int i = 0; i < C::TILES; ++i) ldmatrix_x4(a[i], st + a_off[q] + i * a_tile);
        const int4 bq = lds128(st + b_off + q * C::NS * 32 * 16);
        const uint32_t bw[4] = {static_cast<uint32_t>(bq.x), static_cast<uint32_t>(bq.y),
                                static_cast<uint32_t>(bq.z), static_cast<uint32_t>(bq.w)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // the four 16x16 tiles of the strip: n8 sub-tiles 2j and 2j + 1
          uint32_t f0[2], f1[2];
          dequant_scaled<GROUPED>(bw[j], sw[j], f0, f1);
#pragma unroll
          for (int i = 0; i < C::TILES; ++i) {
            mma_16816(a[i], f0, acc[i][2 * j]);
            mma_16816(a[i], f1, acc[i][2 * j + 1]);
          }
        }
      }
    }
  };

  // --- end of a run inside one column strip: add the k warps, then write C or a partial ------------------------
  const int groups8 = C::R * (C::W / 8);  // 8-column groups of the tile
  auto finish = [&](int col, int seg_begin, int seg_end) {
    // 1. The k warps' tiles meet in `red` (meet_k_warps).
    const int g = lane / 4, t = lane % 4;
    meet_k_warps<C::NK, C::RED_SLICES>(red, C::RED, k_warp, [&](float* tile, bool first) {
#pragma unroll
      for (int i = 0; i < C::TILES; ++i)
#pragma unroll
        for (int j = 0; j < C::SUB; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (C::TRANS) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float* dst = tile + (2 * t + e) * C::RED_STRIDE + n_warp * 64 + 16 * j + 8 * h + g;
                *dst = first ? acc[i][j][2 * h + e] : *dst + acc[i][j][2 * h + e];
              }
            } else {
              float2* dst =
                  reinterpret_cast<float2*>(tile + (16 * i + g + 8 * h) * C::RED_STRIDE + n_warp * 64 + 8 * j + 2 * t);
              float2 v = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
              if (!first) {
                const float2 o = *dst;
                v.x += o.x;
                v.y += o.y;
              }
              *dst = v;
            }
          }
    });
    // 2. 8 consecutive columns per thread: 16-byte stores of C.
    auto store = [&](int e, const float (&v)[8]) {
      const int r = e / (C::W / 8), n0 = col * C::W + e % (C::W / 8) * 8;
      c_g[static_cast<int64_t>(r) * (p.n / 8) + n0 / 8] = scaled_row8<GROUPED, true>(v, p.s, n0);
    };
    auto gather = [&](int e, float (&v)[8]) {
      const float* src = red + (e / (C::W / 8)) * C::RED_STRIDE + (e % (C::W / 8)) * 8;
#pragma unroll
      for (int x = 0; x < 8; ++x) v[x] = met<C::RED_SLICES>(src + x, C::RED);
    };
    write_strip<kThreads, C::W / 8>(segment_part(p, run, C::R * C::W, col, seg_begin, seg_end), groups8, m_rows,
                                    gather, store);
    zero_acc();
  };

  // --- main loop ---------------------------------------------------------------------------------------------
  pipeline<C::STAGES, C::STAGE * 16, C::AHEAD>(run, smem_addr(smem), p.early_dependents, loader_load(loader),
                                               [] {}, compute_stage, finish);
}

constexpr int kMaxDevices = 64;

// A device attribute, read once per device (0 when it cannot be read; the callers check 0 <= device < kMaxDevices).
template <cudaDeviceAttr ATTR>
int device_attribute(int device) {
  static int cache[kMaxDevices] = {};
  if (cache[device] == 0 && cudaDeviceGetAttribute(&cache[device], ATTR, device) != cudaSuccess) cache[device] = 0;
  return cache[device];
}
inline int max_smem(int device) { return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device); }
inline int compute_capability(int device) {  // 10 * major + minor
  return 10 * device_attribute<cudaDevAttrComputeCapabilityMajor>(device) +
         device_attribute<cudaDevAttrComputeCapabilityMinor>(device);
}

// kernel<<<grid, threads, smem, stream>>>(args...), with programmatic dependent launch from compute capability 9.0
// (the kernels' pipeline() waits for the previous kernel before touching anything it may have written).
template <class... P>
cudaError_t launch_kernel(void (*kernel)(P...), int grid, int threads, int smem, int device, cudaStream_t stream,
                          const P&... args) {
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = pdl;
  cfg.numAttrs = compute_capability(device) >= 90 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// The add_parts_kernel instance for L's parts, a band in `band_blocks` blocks (1 or L::MAX_SPLIT).
template <class L>
auto parts_kernel(bool grouped, int band_blocks) {
  constexpr int S = L::MAX_SPLIT;
  if (band_blocks == 1) return grouped ? add_parts_kernel<L, true, 1> : add_parts_kernel<L, false, 1>;
  return grouped ? add_parts_kernel<L, true, S> : add_parts_kernel<L, false, S>;
}

// A GEMM of `grid` blocks whose split column strips' parts are laid out as L says, started by launch(q), and
// add_parts_kernel<L> after it when the launch leaves strips in parts, a band in `band_blocks` blocks (1 or
// L::MAX_SPLIT), unless the kernel adds them itself (OWN: a warp-specialized kernel, where own_parts() holds; q.flags
// is null otherwise); q is p (the kernel's Params, a 2:4 one included) with the early start of the next kernel on when
// add_parts_kernel follows, since its blocks may wait beside the GEMM's.
template <class L, bool OWN = false, class P, class Launch>
cudaError_t launch_with_parts(bool grouped, const P& p, int grid, int device, cudaStream_t stream, Launch&& launch,
                              int band_blocks = 1) {
  const int n_cols = p.n / L::W, k_tiles = p.k / L::DEPTH;
  const bool split = splits_strips(p.blocks_per_chunk, n_cols, k_tiles);
  P q = p;
  if (!OWN || !split || !own_parts(p.blocks_per_chunk, n_cols, k_tiles)) q.flags = nullptr;
  q.early_dependents |= split && q.flags == nullptr;
  if (const cudaError_t err = launch(q); err != cudaSuccess || !split || q.flags != nullptr) return err;
  const int blocks = grid / p.blocks_per_chunk * n_cols * (L::R / 8) * band_blocks;
  return launch_kernel(parts_kernel<L>(grouped, band_blocks), blocks, L::THREADS / band_blocks, 0, device, stream,
                       static_cast<const Params&>(p));
}

// Whether one block of `parts` (`parts_threads` threads) fits on an SM beside as many blocks of `gemm` (`threads`,
// `smem` bytes of dynamic shared memory) as fit there: registers are allocated per warp in steps of 256, and each
// block has shared memory reserved beside its own.
template <class G, class A>
bool fits_beside(G gemm, int threads, int smem, A parts, int parts_threads, int device) {
  cudaFuncAttributes g, a;
  int blocks = 0;
  if (cudaFuncGetAttributes(&g, gemm) != cudaSuccess || cudaFuncGetAttributes(&a, parts) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemm, threads, smem) != cudaSuccess) {
    return false;
  }
  const auto regs = [](int per_thread, int n) { return (n + 31) / 32 * ((per_thread * 32 + 255) / 256 * 256); };
  const int reserved = device_attribute<cudaDevAttrReservedSharedMemoryPerBlock>(device);
  return blocks * regs(g.numRegs, threads) + regs(a.numRegs, parts_threads) <=
             device_attribute<cudaDevAttrMaxRegistersPerMultiprocessor>(device) &&
         blocks * (smem + static_cast<int>(g.sharedSizeBytes) + reserved) + static_cast<int>(a.sharedSizeBytes) +
                 reserved <=
             device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(device);
}

// A GEMM: the instance `grouped` picks of GROUPED and PER_CHANNEL, its dynamic shared-memory limit raised to smem
// once per instance and device, launched through launch_with_parts<L, OWN> with args after its Params. It asks for
// the SM's largest shared-memory configuration: left to choose, the driver takes the smallest that holds the GEMM's
// blocks (196 KB for two 2:4 8 x 256 blocks), and then no add_parts_kernel block fits beside them until one leaves
// (perf-log tl3, cv1). For the same reason a band's parts take L::MAX_SPLIT blocks where a whole band's block does
// not fit beside the GEMM's blocks (the dense 16 x 256 tiles: 185 registers); where it fits, the split was slower
// (the 2:4 16 x 256 tiles: +0.2-0.5 us a layer, perf-log pk1).
template <class L, bool OWN, auto GROUPED, auto PER_CHANNEL, class P, class... A>
cudaError_t launch_gemm(bool grouped, const P& p, int grid, int threads, int smem, int device, cudaStream_t stream,
                        const A&... args) {
  static int band_blocks[2][kMaxDevices] = {};  // 0 until the instance is set up on the device
  const auto kernel = grouped ? GROUPED : PER_CHANNEL;
  if (band_blocks[grouped][device] == 0) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    const bool whole =
        L::MAX_SPLIT == 1 || fits_beside(kernel, threads, smem, parts_kernel<L>(grouped, 1), L::THREADS, device);
    band_blocks[grouped][device] = whole ? 1 : L::MAX_SPLIT;
  }
  return launch_with_parts<L, OWN>(
      grouped, p, grid, device, stream,
      [&](const P& q) { return launch_kernel(kernel, grid, threads, smem, device, stream, q, args...); },
      band_blocks[grouped][device]);
}

// The checks both products make before any launch (k % 128, n % n_multiple, the device, the workspace); sets
// lg_group from the group count (unit: depth of a k tile, 16 dense, 32 for 2:4).
template <class Args>
cudaError_t check_args(const Args& g, int n_multiple, int unit, int* lg_group) {
  if (g.m < 1 || g.k <= 0 || g.n <= 0 || g.k % 128 || g.n % n_multiple || g.groups < 1 || g.sms < 1) {
    return cudaErrorInvalidValue;
  }
  if (g.device < 0 || g.device >= kMaxDevices || g.workspace_len < workspace_ints(g.sms)) return cudaErrorInvalidValue;
  *lg_group = g.groups > 1 ? group_lg(g.k, g.groups, unit) : 0;
  return *lg_group < 0 ? cudaErrorInvalidValue : cudaSuccess;
}

// How many chunks of m one launch runs side by side, each with its own share of the SMs: at most 16 keeps every
// chunk group at 8 or more blocks on the H200.
inline int max_chunks_per_launch(int sms) { return sms >= 16 ? 16 : sms; }

// The host loop all products share. m is cut into chunks of `rows` rows, up to max_chunks_per_launch a launch.
// Fills p's operand fields from g (the caller sets any others) and p.a, p.c, p.m per launch; launch(par) starts one
// group of par chunks.
template <class P, class Args, class Launch>
cudaError_t run_chunk_groups(P& p, const Args& g, const void* a, int lg_group, int rows, Launch&& launch) {
  p.b = static_cast<const int4*>(g.b);
  p.s = static_cast<const int4*>(g.s);
  p.partials = reinterpret_cast<float*>(g.workspace);
  p.flags = g.workspace + workspace_part_ints(g.sms);
  p.n = g.n;
  p.k = g.k;
  p.lg_group = lg_group;
  const int chunks = (g.m + rows - 1) / rows;
  const int max_par = max_chunks_per_launch(g.sms);
  for (int c0 = 0; c0 < chunks; c0 += max_par) {
    const int par = chunks - c0 < max_par ? chunks - c0 : max_par;
    const int64_t row0 = static_cast<int64_t>(c0) * rows;
    p.a = static_cast<const int4*>(a) + row0 * (g.k / 8);
    p.c = static_cast<int4*>(g.c) + row0 * (g.n / 8);
    p.m = static_cast<int>(g.m - row0);
    const cudaError_t err = launch(par);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <class C>
cudaError_t launch(bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
  return launch_gemm<RowParts<C, true>, false, gemm_kernel<C, true>, gemm_kernel<C, false>>(grouped, p, grid, kThreads,
                                                                                            C::SMEM, device, stream);
}

// Tile shapes: small m streams 128 x 128 tiles (two strips, 4 k warps each: the deep k split keeps 8 warps busy on
// few rows); m > 32 takes 256-wide strips with 64-deep stages so each A fragment feeds 32 mma. N not a multiple of
// the strip width falls back to narrower strips. Only the combinations below are compiled (compile time).
struct Choice {
  int rows, ns, stages;
};

template <int ROWS, int NS, int STAGES>
using CfgFor = Cfg<ROWS, NS, NS == 4 ? 4 : 8, STAGES>;

// Every combination choose() can pick (rows, strips, stages), in the order it prefers them for a given chunk height;
// no other is compiled. Chunks of <= 32 rows take 4 stages (<= 16 rows: 3 on short runs), taller ones 8, and 64-row
// chunks with 128-wide strips need 234 KB of shared memory (more than any GPU has): those would be dead code.
#define MARLIN_CONFIGS(X) \
  X(64, 4, 8) X(64, 1, 8) \
  X(48, 4, 8) X(48, 2, 8) X(48, 1, 8) \
  X(32, 2, 4) X(32, 1, 4) \
  X(16, 2, 4) X(16, 2, 3) X(16, 1, 4) X(16, 1, 3) \
  X(8, 2, 4) X(8, 2, 3) X(8, 1, 4) X(8, 1, 3)

// One launcher per 16 rows of chunk height (marlin_mb<MB>.cu takes chunks of 16 * MB - 15 .. 16 * MB rows), each
// compiled in its own file so the builds run in parallel.
#define MARLIN_DECLARE_LAUNCHER(MB) \
  cudaError_t launch_mb##MB(const Choice& c, bool grouped, const Params& p, int grid, int device, cudaStream_t stream);
MARLIN_DECLARE_LAUNCHER(1)
MARLIN_DECLARE_LAUNCHER(2)
MARLIN_DECLARE_LAUNCHER(3)
MARLIN_DECLARE_LAUNCHER(4)

// Shared memory per SM on the H200 (Hopper), and what the device reserves per block.
constexpr int kSm90SmemPerSm = 228 * 1024;
constexpr int kSmemReservePerBlock = 1024;
// Shared memory of one wgmma block: its share of an SM that holds `blocks`; two by default (every configuration fits
// two: has_wgmma).
constexpr int sm90_smem(int blocks) { return kSm90SmemPerSm / blocks - kSmemReservePerBlock; }
constexpr int kSm90Smem = sm90_smem(kMaxBlocksPerSm);
// Stages of `stage` int4 that such a block holds, at most 8 (it also aligns its ring to 1024 bytes).
constexpr int sm90_stages_fit(int stage, int blocks = kMaxBlocksPerSm) {
  return std::min((sm90_smem(blocks) - 1024) / (stage * 16), 8);
}
// Whether a one-warpgroup wgmma configuration of r x w tiles, `depth` deep, may run `blocks` blocks per SM: two, or
// three on the 16 x 128 x 128 tiles sm90_blocks_per_sm counts (and the 2:4 kernel's 8 x 128 x 128 ones it runs in
// their place), or four on those 8 x 128 x 128 ones; either way every block's two part slots fit the workspace.
constexpr bool sm90_blocks_fit(int blocks, int r, int w, int depth) {
  const bool narrow = w == 128 && depth == 128;
  return (blocks == kMaxBlocksPerSm || (blocks == 3 && r <= 16 && narrow) || (blocks == 4 && r <= 8 && narrow)) &&
         int64_t{blocks} * r * w <= kMaxBlocksPerSm * kMaxTileElems;
}
// ... and a warp-specialized block, one per SM (1024 bytes more for its ring's barriers), beside `extra` bytes.
constexpr int sm90_ws_stages_fit(int stage, int extra = 0) {
  return std::min((kSm90SmemPerSm - kSmemReservePerBlock - 2048 - extra) / (stage * 16), 8);
}

// The wgmma kernel on sm_90a (marlin_sm90.cu) for m = 9-32: one warpgroup per block, two blocks per SM (three on some
// 16 x 128 launches: sm90_blocks_per_sm), R-row chunks (wgmma's n) by W-column tiles (W = 128 serves layers too narrow
// for 256-column tiles to fill the GPU: sm90_tile), 128-deep stages (perf-log o2). 16- and 32-row chunks (OFFSET) hold
// 8 or 16 accumulators per wgmma: the weights enter wgmma still offset (1024 + q, 64 + q: no subtract and no fp16
// scaling per weight) and each stage's fp32 sums are corrected and scaled once, as the mma.sync kernel's 8-row chunks
// do (perf-log o1, o7). 64-row chunks run on the warp-specialized kernel (Sm90WsCfg, w10); Sm90Cfg<64> (64-deep stages,
// fp16-scaled weights, 128 accumulators per thread at 64 x 256) remains the shape scripts/bench_wgmma_pattern.cu
// measures the stage loop on.
template <int R_, int W_ = 256, int BLOCKS_ = kMaxBlocksPerSm>
struct Sm90Cfg {
  static constexpr int THREADS = 128;  // one warpgroup
  static constexpr int BLOCKS = BLOCKS_;  // blocks per SM: two, or three on 16 x 128 tiles (sm90_blocks_per_sm)
  static constexpr int R = R_;         // rows of the A / C tile: wgmma's n
  static constexpr int W = W_;
  static constexpr int STRIPS = W / 64;  // 64-column strips of the tile
  static constexpr int NS = STRIPS;      // of the warpgroup; also its wgmma (packed words) per warp and k16 tile
  static constexpr bool OFFSET = R <= 32;  // offset weights, fp32 scaling per stage (above)
  // k16 tiles per stage: one 128-byte swizzle row of A per row, two for OFFSET chunks (their per-stage work, the
  // correction above included, then serves twice the weights)
  static constexpr int KT = OFFSET ? 8 : 4;
  static constexpr int DEPTH = 16 * KT;  // k per tile
  static constexpr int A_CHUNKS = 2 * KT;
  static constexpr bool A_PANELS = true;  // the A tile as 64-deep swizzle panels (StageLoader)
  static constexpr int AHEAD = 1;  // pipeline(): one tile's weights before the wait (perf-log pw1, pw2)
  static constexpr int A_STAGE = R * A_CHUNKS;
  static constexpr int B_STAGE = KT * NS * 32;
  static constexpr int S_ROWS = KT / 2;
  static constexpr int S_STAGE = S_ROWS * NS * 8;
  static constexpr int STAGE = (A_STAGE + B_STAGE + S_STAGE + 63) / 64 * 64;  // whole 1024-byte swizzle atoms
  // as many stages as BLOCKS blocks per SM hold, at most 8 (5 for three at 16 x 128); 16 x 256 tiles take 3,
  // measured faster than 4 or 5 on every layer (perf-log o3)
  static constexpr int STAGES = R == 16 && W == 256 ? 3 : sm90_stages_fit(STAGE, BLOCKS);
  static constexpr int SMEM = STAGES * STAGE * 16 + 1024;  // + room to align the ring to 1024 bytes
  static constexpr int C_ROWS = 0;  // whole strips go to C from the registers (store_registers)
  static constexpr int ACC = R / 2;                        // accumulators per thread per wgmma (m64 x nR / 128)
  static_assert(R == 16 || R == 32 || R == 64, "wgmma's n: 16, 32 or 64");
  static_assert(NS == 2 || NS == 4, "each warp takes half a strip's words or a whole strip");
  static_assert(A_CHUNKS % 8 == 0, "the A tile must be whole 128-byte swizzle panels: 64 fp16 per row");
  static_assert(STAGES >= 3 && SMEM <= sm90_smem(BLOCKS), "a ring of at least 3 stages, BLOCKS blocks per SM");
  static_assert(sm90_blocks_fit(BLOCKS, R, W, DEPTH), "blocks per SM: sm90_blocks_fit");
};

// The warp-specialized wgmma kernel for m > 32 (marlin_sm90.cu): R-row chunks (64 up to m = 64, 96 up to m = 96, 128
// up to m = 128, 256 above) by W columns (512, 256 or 128 for 64-row chunks, 256 or 128 for 96- and 128-row ones, 128
// for 256-row ones), one block per SM of two computing warpgroups (W / 2 columns each, per k16 tile: two m64nRk16 at
// R x 256, one at R x 128 for R = 96 and 128, one m64n256k16 at 256 x 128, four m64n64k16 at 64 x 512, two at
// 64 x 256, one at 64 x 128) and one warpgroup of which one thread issues the stages' copies: the A tile by a tensor
// copy, weights and scales by bulk copies, each ring slot's arrival and release counted on mbarriers, no block barrier
// in the loop (perf-log w8, w10, w11, w12).
// The block of both warp-specialized kernels (dense and 2:4, ws_kernel in wgmma.cuh).
struct WsBlock {
  static constexpr int CONSUMERS = 2;                  // computing warpgroups
  static constexpr int THREADS = 128 * CONSUMERS;      // computing threads (the column map and the parts' layout)
  static constexpr int BLOCK_THREADS = THREADS + 128;  // + the copying warpgroup
  // registers per thread after setmaxnreg: each of the SM's four schedulers holds two computing warps and a copying
  // one in its 16K registers (at launch all three get 168)
  static constexpr int COPY_REGS = 40, COMPUTE_REGS = 232;
  static constexpr int C_ROWS = 0;  // rows of a whole strip staged per round in shared memory (0: none; store_staged)
};
// Whether config C's split strips save fp16 parts: the warp-specialized kernels' (WsBlock), whose blocks all read
// their later parts at their runs' ends at once, at the L2's shared rate (7B batch 128: dense -6%, 2:4 -4%; perf-log
// kb1, h16). Each part is rounded once, 2^-11 of its size, before the fp32 sums. The other kernels keep fp32 parts:
// fp16 ones ran them up to 15% slower a layer at m <= 16 (h16).
template <class C>
constexpr bool kHalfParts = std::is_base_of<WsBlock, C>::value;
template <int R_, int W_>
struct Sm90WsCfg : WsBlock {
  static constexpr int R = R_, W = W_;
  static constexpr int STRIPS = W / 64;          // 64-column strips of the tile
  static constexpr int NS = STRIPS / CONSUMERS;  // of a warpgroup; also its wgmma (packed words) per warp and k16 tile
  static constexpr int KT = 4, DEPTH = 16 * KT;
  static constexpr int A_STAGE = R * 8;             // one 64 x R tensor-copy box
  static constexpr int B_STAGE = KT * STRIPS * 32;  // KT rows of STRIPS x 32 lanes x 16 bytes, one bulk copy each
  static constexpr int S_ROWS = KT / 2;             // scale rows a stage spans (groups of 32), one bulk copy each
  static constexpr int S_STAGE = S_ROWS * STRIPS * 8;
  static constexpr int STAGE = (A_STAGE + B_STAGE + S_STAGE + 63) / 64 * 64;  // whole 1024-byte swizzle atoms
  static constexpr int STAGES = sm90_ws_stages_fit(STAGE);
  static constexpr int SMEM = STAGES * STAGE * 16 + 1024;  // + room to align the ring to 1024 bytes
  static constexpr int ACC = R / 2;                        // accumulators per thread per wgmma
  static_assert(((R == 64 || R == 96 || R == 128) && (W == 128 || W == 256)) || (R == 64 && W == 512) ||
                    (R == 256 && W == 128),
                "64, 96 or 128 rows by 128 or 256 columns, 64 x 512 or 256 x 128: 128 accumulators at most");
  static_assert(STAGES >= 4, "a ring of at least 4 stages");
  static_assert(R * W <= kMaxBlocksPerSm * kMaxTileElems, "one block per SM: its partial tile takes two blocks' slots");
};

// The wgmma kernel's tile for m > 8 rows and n columns (m <= 8 takes the mma.sync kernel's transposed 8-row chunks,
// faster there: perf-log o1): 16-row chunks for m <= 16 (not with groups smaller than their 128-deep stage, which
// would need the fp32 scaling more than once per stage: the mma.sync kernel takes those); 32-row chunks for
// m <= 32 (those groups: 64-row chunks; o7); above, the warp-specialized kernel's 64-row chunks up to m = 64 (two
// 32-row chunks side by side lost, o7; the one-warpgroup kernel's 64-row chunks were 5-10% slower, w10), 96-row
// chunks up to m = 96 (a quarter less tensor and A-tile work than 128 rows: w12), 128-row chunks up to m = 128 and
// 256-row chunks by 128 columns above.
// Chunks of 16 to 128 rows take 256 columns, or 128 where 256-column strips in at most 8 parts each would leave
// more than a quarter of the device's `slots` (two per SM) empty (7B layers with n = 4096 fill half of them; the
// 128-row chunks also take 256 where their runs are long, sm90_cols128); the 64-row chunks count one slot per SM,
// their warp-specialized block's (n = 4096 takes 256 columns: perf-log w10), and take 512 columns where the runs are
// at least 48 tiles long (64 deep): fewer instructions and A-tile copies per weight, against a larger part to save or
// add at a strip's end (w11: runs of 54 and 109 tiles -9% / -13%, of 27-33 +4%, of 12-21 +15-20%). cols = 0: no
// wgmma tile fits.
struct Sm90Tile {
  int rows, cols;
};
// The width of 16- to 128-row chunks' tiles on n columns; also the 2:4 wgmma.sp kernel's.
inline int sm90_cols64(int n, int slots) {
  if (n % 256 == 0 && 4 * (n / 256 * 8) >= 3 * slots) return 256;
  return n % 128 == 0 ? 128 : 0;
}
// The 128-row chunks' width (one warp-specialized block per SM, dense and 2:4), m rows: also 256 columns where the
// launch's chunks give each SM at least 12 tiles of 256 x 128 deep: half the A tile's copies per weight (and, on the
// 2:4 kernel, half the dequantization) against more parts per strip. 14336 x 4096 at m = 128 -15% / -5% (dense /
// 2:4), 2:4 at m = 200 / 256 -17% / -16%, 11008 x 4096 there (21 tiles an SM) -24% / -3%; 11008 x 4096 at m = 128
// (10) +5% and 4096 x 4096 (4 and 8) +6-19% on 256 columns (perf-log c256).
inline int sm90_cols128(int m, int n, int k, int sms) {
  const int per_launch = max_chunks_per_launch(sms);
  const int chunks = (m + 127) / 128 < per_launch ? (m + 127) / 128 : per_launch;
  if (n % 256 == 0 && int64_t{chunks} * (n / 256) * (k / 128) >= 12 * sms) return 256;
  return sm90_cols64(n, sms * kMaxBlocksPerSm);
}
inline Sm90Tile sm90_tile(int m, int n, int k, int slots, bool small_groups) {
  if (m <= 8) return {8, 0};
  if (m <= 16) return {16, small_groups ? 0 : sm90_cols64(n, slots)};
  if (m <= 32 && !small_groups) return {32, sm90_cols64(n, slots)};
  if (m > 128) return {256, n % 128 == 0 ? 128 : 0};
  if (m > 96) return {128, sm90_cols128(m, n, k, slots / kMaxBlocksPerSm)};
  if (m > 64) return {96, sm90_cols64(n, slots)};
  const int sms = slots / kMaxBlocksPerSm;
  if (n % 512 == 0 && 4 * (n / 512 * 8) >= 3 * sms && int64_t{n / 512} * (k / 64) >= 48 * sms) return {64, 512};
  return {64, sm90_cols64(n, sms)};
}
cudaError_t launch_sm90(const Sm90Tile& tile, int blocks_per_sm, bool grouped, const Params& p, int grid, int device,
                        cudaStream_t stream);
// Whether the wgmma kernels can run: built for sm_90a (MARLIN_SM90A) and the device is compute capability 9.0.
bool has_wgmma(int device);

// Whether the dense wgmma kernel's `rows`-row chunks run on the warp-specialized block (from 64 rows: perf-log w8,
// w10).
inline bool sm90_ws(int rows) { return rows >= 64; }
// Blocks per SM of the wgmma kernels on rows x cols tiles of an n x k layer: one warp-specialized block (`ws`), else
// two of one warpgroup, or three (6 / 5 stages each, 2:4 / dense) on 16 x 128 tiles where that leaves each SM fewer
// tiles (128 deep; 16-row chunks run one chunk per launch, m <= 16). A block takes a run of whole tiles, so an SM's
// work is its blocks times their runs' length: three blocks on 11008 x 4096 give an SM 21 tiles (22 with two) and
// were 7-9% faster; on equal work they were up to 9% slower (more, shorter runs, so more parts), on one tile more per
// SM 3-15% slower (perf-log s25). With `eight` (the 2:4 kernel at m <= 8, which runs 8-row chunks at three or four
// blocks: half a 16-row chunk's A work, though at two blocks they were slower than 16 rows, perf-log r8) also four
// blocks, and either count on as many tiles per SM as fewer blocks where its runs are 4 tiles or more: 14336 x 4096
// at m = 1-8 -12% and 8192 x 4096 -5% at four, 4096 x 6144 -9% at three; 4096 x 4096, a tie on runs of 2 at four,
// was level back to back and 7% slower alone (perf-log b4, b5).
inline int sm90_blocks_per_sm(bool ws, int rows, int cols, int sms, int n, int k, bool eight = false) {
  if (ws) return 1;
  if (rows != 16 || cols != 128) return kMaxBlocksPerSm;
  const int tiles = n / 128 * (k / 128);
  const auto run = [&](int blocks) { return tiles_per_run(tiles, sms * blocks); };
  const auto sm_tiles = [&](int blocks) { return blocks * run(blocks); };
  const auto better = [&](int blocks, int than) {
    return sm_tiles(blocks) < sm_tiles(than) || (eight && sm_tiles(blocks) == sm_tiles(than) && run(blocks) >= 4);
  };
  const int best = better(3, kMaxBlocksPerSm) ? 3 : kMaxBlocksPerSm;
  return eight && better(4, best) ? 4 : best;
}
// Blocks per chunk for the wgmma kernels on `rows`-row chunks: every block slot (`blocks_per_sm` per SM), shared by
// `par` chunks. Chunks of 32 rows and more take at most 8 parts per column strip: a 64-row tile's fp32 partial is
// 64 KB (128 KB from 128 rows), as much as 8 64 x 256 tiles of dense weights, written and read back (4096 x 4096 at
// m = 64, when one block added the parts: 33.5 -> 21.5 us; perf-log; 32-row chunks on every slot: 70B m = 17-32
// +3-5%, o7). A 16-row partial is one or two tiles of weights, as in the mma.sync kernels, which take every slot (a
// cap of 8 parts there: the 7B set at m = 16 +3%, perf-log o1).
inline int sm90_blocks_per_chunk(int sms, int par, int n_cols, int k_tiles, int rows, int blocks_per_sm) {
  constexpr int kParts = 8;
  const int all = sms * blocks_per_sm / par;
  if (rows <= 16) return all;
  const int min_iters = (k_tiles + kParts - 1) / kParts;
  const int capped = (n_cols * k_tiles + min_iters - 1) / min_iters;
  return capped < all ? capped : all;
}

// Sets a launch's blocks per chunk (`per_chunk`, for `par` chunks) and lets the next kernel start at once when the
// grid takes every one of the device's `slots` block slots (pipeline()); returns the grid. Every launcher's last step.
template <class P>
int size_grid(P& p, int par, int per_chunk, int slots) {
  p.blocks_per_chunk = per_chunk;
  const int grid = par * per_chunk;
  p.early_dependents = grid >= slots;
  return grid;
}

// Only the configurations of one file's chunk heights are instantiated there (if constexpr inside a template).
template <int MB>
cudaError_t launch_mb(const Choice& c, bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
#define MARLIN_LAUNCH_IF(ROWS, NS, ST)                                         \
  if constexpr ((ROWS + 15) / 16 == MB) {                                     \
    if (c.rows == ROWS && c.ns == NS && c.stages == ST) {                     \
      return launch<CfgFor<ROWS, NS, ST>>(grouped, p, grid, device, stream);   \
    }                                                                         \
  }
  MARLIN_CONFIGS(MARLIN_LAUNCH_IF)
#undef MARLIN_LAUNCH_IF
  return cudaErrorInvalidConfiguration;
}

#define MARLIN_DEFINE_LAUNCHER(MB)                                                                                \
  cudaError_t launch_mb##MB(const Choice& c, bool grouped, const Params& p, int grid, int device,                 \
                            cudaStream_t stream) {                                                                \
    return launch_mb<MB>(c, grouped, p, grid, device, stream);                                                    \
  }

}  // namespace detail
}  // namespace marlin_cli
