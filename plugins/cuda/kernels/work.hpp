// The work descriptions the host (dispatch.cpp) hands to the kernels: plain structs of device pointers and
// integers, compiled by both g++ and nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata_cuda {

// Weight formats, the numbers of strata_dtype.
enum : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2, kQ4Row = 3, kQ4G64 = 4 };

// Every matrix row on the device, and every operand row, is padded to a multiple of kColPad columns (one Q4_G64
// group): the padding weights are finite (zero bytes) and the padding activations zero, so they add nothing.
constexpr int kColPad = 64;

// One weight matrix W[rows, cols] as the kernels read it: kp = 64 * ceil(cols / 64) columns in the weight
// format (int4: kp / 2 bytes, nibble pairs as on the host), in one of two layouts:
//   kRowMajor: row o starts at data + o * stride (bytes); every format (host weights staged per call too);
//   kTiles (resident int4 matrices): tiles of 16 rows, each stored in the order the tensor-core kernels load it.
//     stride is the row's byte count rounded up to 64 (a 128-column "unit"); rows are padded to a multiple of
//     16 with zero bytes. Tile t (rows 16t ..) starts at data + 16 t stride and holds its units in order, 1 KB
//     each: bytes 64 u .. 64 u + 63 of row 16t + 8h + g are at 1024 u + 512 h + 64 g, there the 8 bytes
//     32 k + 8 q .. (group k of the unit, columns 16 q .. 16 q + 15 of the group) at 16 q + 8 k. A warp of a
//     tensor-core kernel then reads 512 contiguous bytes per load (lane 4g + q: row g or g + 8, its 8 bytes of
//     each group as 16 bytes at 16 q); with rows in order it read 8 rows x 64 bytes per load, which measured
//     2.1 TB/s of pure reads on the H200 at 16 warps per SM against 3.3 TB/s for 512 contiguous bytes
//     (bench_read). Any 8-byte aligned piece of a row stays contiguous (q4_row_byte), so the SIMT kernels read
//     both layouts (the gemv kernels read a 16-byte chunk of a tile as its two pieces).
// Q4_G64 scales (q4_scale_at): kRowMajor, rows in order, scales[o * (kp / 64) + g]; kTiles, in blocks of 16
// rows x 4 groups, 256 bytes each, in the order a tensor-core warp reads them: group g of row 16t + r at
// 64 (t ceil(n / 4) + g / 4) + 4 r + g % 4 (n = kp / 64; padding zero). A warp's scales of a load batch (4
// groups of its rows g, g + 8) are then 2 x 128 contiguous bytes, next to the previous batch's, instead of 16
// pieces of 16 bytes a row apart (H100, runs 64-69: the decode layer 0.9-1.3 us faster at 1-4 rows).
// Q4_ROW: scales[o] in both layouts.
enum : int32_t { kRowMajor = 0, kTiles = 1 };
// The kTiles scale index of group grp of row `row` (n groups per row) as a row part plus a group part; the
// host's upload and the kernels both use these.
__host__ __device__ inline int64_t tile_scale_row(int32_t row, int32_t n) {
  return static_cast<int64_t>(row >> 4) * ((n + 3) >> 2) * 64 + (row & 15) * 4;
}
__host__ __device__ inline int32_t tile_scale_grp(int32_t grp) { return (grp >> 2) * 64 + (grp & 3); }
struct DevMatrix {
  const void* data;
  const float* scales;
  int64_t stride;
  int32_t rows, cols, kp, dtype;
  int32_t layout;
};

// A work item: one chunk of tokens (rows of x) through one matrix (linear) or through a gate/up pair (gate_up).
//
// Input operand `in`, by kernel family:
//  - tensor-core (int4) kernels, exact mode (in_splits = kI8Splits): each token as 4 int8 digit planes of a
//    per-64-column-group fixed-point form (see i8_encode in device_util.cuh): ncols * kp bytes with ncols =
//    8 * NT of the launch, column n = 4 r + p holding plane p of token r (columns past 4 * n_tok zero), the
//    columns of each 128-column unit in the order the threads feed mma.sync (i8_pos), column-major for the wide
//    kernels and with each n-tile's unit of 8 columns together for the others (i8_at); then, at byte 8 * NT * kp,
//    the group multipliers, f32 [2 * NT][kp / 64] (token r, group G: 2^(e - 34) for the group's exponent e,
//    NaN for a group holding a non-finite value, 0 for tokens past n_tok).
//  - tensor-core kernels, W4A16 mode (in_splits = 1): bf16, [ncols][kp] with ncols = 8 * NT; column r holds
//    token r rounded to bf16; columns past n_tok are zero. Within each 16-column chunk the columns are stored
//    4x4-transposed (slot 4s + t holds column s + 4t), the order in which a thread feeds them to mma.sync.
//  - SIMT kernels: f32, [n_tok][kp] (in_splits = 0).
//  - gemv kernels (int4, exact mode): f32 [n_tok][gemv_ld(kp)] with column k scaled by 16^-(k % 4), stored in
//    the order the warps read it (gemv_slot: a warp's float4 loads are 512 contiguous bytes) (in_splits =
//    kGemvSplits; see gemv_x_scale and gemv_q4.cuh).
// Outputs:
//  - linear: y[r * y_ld + o] (f32) for r < n_tok, o < rows.
//  - gate_up: h = silu(gate·x) * (up·x) written as the next stage's input operand: h_splits == 1: the W4A16
//    bf16 layout, row length h_kp; h_splits == 0: f32 [n_tok][h_kp] (also the staging form the exact-mode
//    down operand is encoded from, by a second preparation pass: its groups need their maxima first);
//    h_splits == kGemvSplits: the gemv kernels' scaled, slot-ordered f32 [n_tok][gemv_ld(h_kp)].
struct WorkItem {
  DevMatrix w0;  // linear: the weight; gate_up: gate
  DevMatrix w1;  // gate_up: up (same shape and format as gate)
  const void* in;
  float* y;
  int64_t y_ld;
  void* h;
  int32_t h_splits, h_kp;
  int32_t n_tok, in_splits;
};

// A preparation job: builds one work item's input operand from f32 rows of x (gathered through `rows`, or the
// consecutive rows row0 ..), and zero-fills one other region (an operand or staging buffer its gate_up output
// goes to).
struct PrepJob {
  const float* x;
  int64_t x_ld;
  const int32_t* rows;  // n_tok row indices, or NULL
  void* dst;
  void* zero;          // NULL or a region of zero_bytes (a multiple of 16) to clear
  int64_t zero_bytes;
  int32_t row0, n_tok, cols, kp;  // kp: the operand's row length (gemv: gemv_ld of the matrix's kp)
  int32_t splits;  // kI8Splits: the exact tensor-core digit planes; 1: the W4A16 bf16 layout; 0: f32
                   // [n_tok][kp]; kGemvSplits: f32 [n_tok][kp] scaled for the gemv kernels
  int32_t ncols;   // rows of the operand to write: 8 * NT (tensor-core) or n_tok (f32)
};

// The layer kernel's work (tc_layer.cuh): an expert group's gate/up and down passes in one launch.
struct LayerWork {
  const WorkItem* items;   // n_items gate_up items, then their n_items down items in the same order
  const PrepJob* dn_jobs;  // n_items: each down operand's encoding from its gate_up item's f32 h
  int32_t* sync;           // 1 + n_items (1 + ceil(gu_tiles / 4)) counters, zero at launch: the ticket, per
                           // item its down operand's groups encoded, per item and 64-row group of h its
                           // gate/up tiles done
  int32_t n_items, gu_tiles, dn_tiles;  // tiles per gate_up item and per down item (of the instance's MT)
  int32_t persistent;  // 0: a block per tile; 1: as many blocks as the device holds, each taking tiles in turn
  int32_t max_sms;     // (host, persistent: the SMs its grid is sized for; 0: all the device's)
  // NULL, or where each ticket's tile records its timeline (bench_cuda --timeline; for tickets below
  // timeline_n): kTimelineWords words per ticket, see kTimeline*.
  uint64_t* timeline;
  int32_t timeline_n;
};
// A ticket's timeline record: the SM and block that ran it (sm << 32 | block), then, in the device's ns
// clock (global_ns), when the block took it, when its inputs were there (the previous launch waited for;
// a down tile: its expert's h encoded too; 0 for a tile past its item's rows), when its outputs were stored
// (before a gate/up tile's count) and when it ended (a gate/up tile: after its count and any encoding).
enum : int { kTimelineWho, kTimelineBegin, kTimelineInputs, kTimelineStored, kTimelineEnd, kTimelineWords };
// After the tickets' records, the first preparation launch's (prep_operands.cu, its `stamps`): its earliest block
// start, stored bitwise negated (so that an atomicMax over the blocks keeps the earliest), and its latest block
// end, in the same clock.
enum : int { kPrepStampFirst, kPrepStampLast, kPrepStampWords };

// Tensor-core kernels: a block is kTcLinearTiles 16-row tiles (linear: a warp per tile over the whole K) or, with
// gate/up in ksg K slices (Settings::gate_up_slices), 2 / ksg tiles of gate and of up (ksg warps per tile and
// matrix) (tc_q4.cuh).
constexpr int kTcWarps = 4;
constexpr int kTcRowsPerBlock = 16;  // rows of a tile
constexpr int kTcLinearTiles = 4;
constexpr int tc_gate_up_rows(int ksg) { return kTcRowsPerBlock * kTcWarps / (2 * ksg); }
// The wide exact kernels (prefill, tc_wide.cuh): items of kWideNt n-tiles (16 tokens), blocks of 32 (ksg 2) or
// 64 (ksg 1) rows of gate and of up, or 128 rows of a linear matrix.
constexpr int kWideNt = 8;
constexpr int wide_gate_up_rows(int ksg) { return 64 / ksg; }
constexpr int kWideRowsLinear = 128;
// SIMT kernels: 8 warps per block; a warp takes 4 rows (linear) or 2 gate+up row pairs, up to 8 tokens.
constexpr int kSimtWarps = 8;
constexpr int kSimtMaxTok = 8;
constexpr int kSimtRowsLinear = 4;
constexpr int kSimtRowsGateUp = 2;
// gemv kernels (int4, 1..8 tokens): 4 warps per block; a warp takes 4 rows (linear) or 2 gate+up row pairs.
// Their operands are marked by this "splits" value.
constexpr int kGemvWarps = 4;
constexpr int kGemvMaxTok = 8;
constexpr int kGemvRowsLinear = 4;
constexpr int kGemvRowsGateUp = 2;
constexpr int kGemvSplits = -1;
// The exact tensor-core operands (int8 digit planes, 4 columns per token) are marked by this "splits" value.
constexpr int kI8Splits = -2;
constexpr int kI8Planes = 4;
// A gemv warp step covers 32 lanes x 32 columns; a gemv operand row is a whole number of steps.
constexpr int kGemvStepCols = 1024;

// Where a kernel is queued: the stream, and whether it may start while the previous kernel on the stream is
// still running (programmatic dependent launch). Every kernel here waits for its predecessor (grid_dep_wait,
// device_util.cuh) before reading anything but its weights and work items, so only weight loads overlap the
// previous kernel's last wave.
struct Queue {
  cudaStream_t stream;
  bool pdl;
};

// Kernel launchers (kernels/*.cu). Each returns the launch error (cudaSuccess when queued). items/jobs are device
// arrays; grid_x blocks along the output rows, one block row (grid y) per item.
// warp_jobs: some job builds int8 digit planes (warp-collective; see prep_operands.cu).
// stamps: NULL, or where the launch notes its first block's start and last block's end (kPrepStamp*).
cudaError_t launch_prep(const PrepJob* jobs, int n_jobs, int blocks_x, bool warp_jobs, uint64_t* stamps,
                        const Queue& on);
// The PTX version (10 major + minor) this build's kernels run from on the current device: 90 or more when
// they hold griddepcontrol (compiled for compute_90+; a compute_80 PTX the driver compiled for an sm_90
// device has none, so dependent launches must stay off there). 0 when the query fails.
int kernels_ptx_version();
// Tensor-core int4 kernels. splits: kI8Splits (exact mode) with nt in 1..4, or 1 (W4A16) with nt in {1, 2, 4};
// tiles: every matrix of the items is resident in kTiles (exact mode then runs instances with compile-time
// strides).
// ksg (gate/up): K slices, 1 or 2 (Settings::gate_up_slices; grid_x blocks of tc_gate_up_rows(ksg) rows).
cudaError_t launch_gate_up_q4g64_tc(int splits, int nt, bool tiles, int ksg, const WorkItem* items, int n_items,
                                    int grid_x, const Queue& on);
cudaError_t launch_gate_up_q4row_tc(int splits, int nt, bool tiles, int ksg, const WorkItem* items, int n_items,
                                    int grid_x, const Queue& on);
cudaError_t launch_linear_q4g64_tc(int splits, int nt, bool tiles, const WorkItem* items, int n_items, int grid_x,
                                   const Queue& on);
cudaError_t launch_linear_q4row_tc(int splits, int nt, bool tiles, const WorkItem* items, int n_items, int grid_x,
                                   const Queue& on);
// The wide exact kernels (nt = kWideNt): gate/up in ksg K slices (grid_x blocks of wide_gate_up_rows(ksg) rows)
// or linear (kWideRowsLinear rows).
// The shared memory a wide block asks for (the largest of gate/up and linear; above 48 KB, so the device must
// allow it per block: cudaDevAttrMaxSharedMemoryPerBlockOptin).
unsigned wide_smem_bytes();
cudaError_t launch_wide_q4g64_tc(bool gate_up, bool tiles, int ksg, const WorkItem* items, int n_items, int grid_x,
                                 const Queue& on);
cudaError_t launch_wide_q4row_tc(bool gate_up, bool tiles, int ksg, const WorkItem* items, int n_items, int grid_x,
                                 const Queue& on);
// The layer kernel (exact mode, nt 1 or 2): lw.n_items * (gu_tiles + dn_tiles) blocks.
// lean: the instance with one block more per SM (B values loaded at use; tc_layer.cuh). mg, md: 16-row tiles per
// warp of the gate/up and the down tiles: 1 and 1, 2 and 1, or 2 and 2 (2: gate/up tiles of 32 rows, down tiles
// of 128; lw's tile counts are of those). ksg: gate/up K slices (2; or 1 with mg = 1: gate/up tiles of 32 rows,
// down tiles of 64 or 128).
cudaError_t launch_layer_q4g64_tc(int nt, bool lean, int mg, int md, int ksg, const LayerWork& lw, const Queue& on);
cudaError_t launch_layer_q4row_tc(int nt, bool lean, int mg, int md, int ksg, const LayerWork& lw, const Queue& on);
// gemv (SIMT f32, memory-bound) int4 kernels: every item of the launch has n_tok == t, 1 <= t <= 8.
cudaError_t launch_gate_up_q4g64_gemv(int t, const WorkItem* items, int n_items, int grid_x, const Queue& on);
cudaError_t launch_gate_up_q4row_gemv(int t, const WorkItem* items, int n_items, int grid_x, const Queue& on);
cudaError_t launch_linear_q4g64_gemv(int t, const WorkItem* items, int n_items, int grid_x, const Queue& on);
cudaError_t launch_linear_q4row_gemv(int t, const WorkItem* items, int n_items, int grid_x, const Queue& on);
// A kernel that spins for `us` microseconds (bench: queues the launches after it; kernels/hold.cu).
cudaError_t launch_hold(int us, cudaStream_t stream);
// Keeps n_sms SMs to itself until *stop is set or limit_ms has passed (bench: the kernels measured run on the
// other SMs; kernels/hold.cu): a block per SM with all the shared memory a block may have. *started counts
// the blocks running, smids[] their SMs; *expired is set when the time ran out. The emulation:
// cudaErrorNotSupported.
cudaError_t launch_occupy(int n_sms, const volatile int* stop, int* started, int* expired, int* smids,
                          int limit_ms, cudaStream_t stream);
// SIMT f32 kernels for every format (up to kSimtMaxTok tokens per item).
cudaError_t launch_gate_up_simt(int dtype, const WorkItem* items, int n_items, int grid_x, const Queue& on);
cudaError_t launch_linear_simt(int dtype, const WorkItem* items, int n_items, int grid_x, const Queue& on);

}  // namespace strata_cuda
