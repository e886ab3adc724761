// The layer kernel: an expert group's gate/up tiles and down tiles (exact mode, tensor cores) in one launch.
// Each block takes a ticket (an atomic counter) and with it its work, in order: every gate/up tile of item 0,
// of item 1, .., then every down tile of item 0, 1, ... The down operand's group G (h columns 64 G ..) needs
// the gate/up tiles of rows 64 G .. (4 of 16 rows, or 2 of 32): the last of them to finish encodes it
// (encode_i8_unit, as the preparation pass does) and counts it; an item's down blocks load their first weights,
// then wait until all of its groups are counted. So the down tiles of the first experts run while the last
// gate/up tiles still do, with no kernel boundary, preparation launch or wave tail between the two passes;
// every tile's arithmetic is tc_q4_tile's, so the results equal the separate launches' bit for bit. Every
// matrix of a layer launch is a resident one in kTiles (the planner's condition; staged host weights take the
// separate launches), so the tiles' addresses are compile-time strides (tc_q4_tile's TILES).
//
// No deadlock whatever the block scheduling: a block only ever waits (in a down tile) for gate/up tiles, whose
// tickets are smaller; a gate/up tile waits only for the previous launch, and its ticket is held by a block
// that is running: the block took it either for its first tile or, persistent, as its next ticket near the
// end of an earlier tile, itself a gate/up tile (tickets grow), which ends without waiting. So the smallest
// unfinished ticket always makes progress (also with several groups' layer kernels in flight). The counters
// live in the group's device buffer, zeroed by the copy of the group's head before each launch.
//
// Persistent (LayerWork::persistent): the launch has as many blocks as the device holds at once and each takes
// tiles until the tickets run out. Between two tiles a block's slot would otherwise sit without a load in
// flight while the block retires, the next one launches, takes its ticket (an atomic round trip), reads its
// work item and waits for its first weights; here the next ticket is taken as the current tile's last two
// batches begin, and the next tile's first two batches are requested right after the current tile's staging
// barrier, before its epilogue, count and encoding. (A streaming form, which took the next ticket as a tile
// started and loaded the next tile's first batches into each weight buffer as soon as it was free, measured
// ~11 us slower at every row count, run52: a block holding a ticket ahead leaves up to two tiles to the last
// wave. Removed.)
//
// Code size counts here, also code that never runs: gate/up and down tiles run side by side on an SM, each with
// its own main loop, and the warps stall on instruction fetch. ~1,600 instructions of a never-taken branch
// (SM-ordered tickets, off) cost 1 us at 1-2 rows and 4 us at 3-4 rows of a GLM-5.2 layer on an H100 ("no
// instruction" stalls 0.41 against 0.10 cycles per issue; run150). A change here is A/B'd against the previous
// build's binary in one machine start, not by an environment switch inside the new binary.
#pragma once

#include "encode_i8.cuh"
#include "tc_q4.cuh"

namespace strata_cuda {

// The first two batches of the tile of ticket t into r (none past the last ticket or past its item's rows);
// how many.
template <int FMT, int MG, int MD, int KSG>
__device__ __forceinline__ int prime_layer_tile(const LayerWork& lw, int t, I8Regs& r) {
  const int n_gu = lw.n_items * lw.gu_tiles;
  if (t < n_gu) {
    const int i = t / lw.gu_tiles;
    return prime_i8_tile<FMT, true, MG, KSG>(lw.items[i], t - i * lw.gu_tiles, r);
  }
  const int d = t - n_gu, i = d / lw.dn_tiles;
  if (i >= lw.n_items) return 0;
  return prime_i8_tile<FMT, false, MD>(lw.items[lw.n_items + i], d - i * lw.dn_tiles, r);
}

// Ticket t's timeline record from the times noted in shared memory (thread 0, as the tile ends; out of line, so
// the kernel holds no registers for it).
static __device__ STRATA_NOINLINE void write_timeline(const LayerWork& lw, int t, const uint64_t* times) {
  if (t >= lw.timeline_n) return;
  uint64_t* rec = lw.timeline + static_cast<int64_t>(t) * kTimelineWords;
  rec[kTimelineWho] = static_cast<uint64_t>(sm_id()) << 32 | blockIdx.x;
  rec[kTimelineBegin] = times[kTimelineBegin];
  rec[kTimelineInputs] = times[kTimelineInputs];
  rec[kTimelineStored] = times[kTimelineStored];
  rec[kTimelineEnd] = global_ns();
}

// The layer kernel's carry between a block's tiles (tc_q4_tile's hooks), when lw.persistent: thread 0 takes
// the next ticket as the tile's last two batches begin (the atomic's latency hides behind them; taken earlier,
// a block would hold a ticket it cannot start for a whole tile), publishes it before the epilogue's staging,
// and every thread loads its warp's first two batches of that tile into the weight registers right after the
// staging barrier, so they arrive while this tile's epilogue (and a gate/up tile's count and encoding) runs.
template <int FMT, int MG, int MD, int KSG>
struct LayerCarry {
  static constexpr bool kOn = true;
  const LayerWork& lw;
  I8Regs& r;
  int& primed_;   // batches of the current tile already in r
  int* s_next;    // shared: the next ticket
  int next = -1;  // thread 0: the next ticket, once taken
  int next_all;   // every thread, after refill: the next ticket (past the last one: none)
  float* stage_;  // shared: the epilogue's staging (tc_q4_tile's Stage), for tiles of both kinds
  __device__ __forceinline__ I8Regs& regs() { return r; }
  __device__ __forceinline__ float* stage() { return stage_; }
  __device__ __forceinline__ int primed() const { return primed_; }
  __device__ __forceinline__ void near_end() {
    if (lw.persistent && threadIdx.x == 0 && next < 0) next = atomicAdd(lw.sync, 1);
  }
  __device__ __forceinline__ void before_stage() {
    near_end();  // (a tile with no whole batch, or skipped, never reached it)
    if (lw.persistent && threadIdx.x == 0) *s_next = next;
  }
  __device__ __forceinline__ void refill() {
    if (!lw.persistent) return;  // (next_all stays past the last ticket: the block ends after this tile)
    next_all = *s_next;
    primed_ = prime_layer_tile<FMT, MG, MD, KSG>(lw, next_all, r);
  }
  __device__ __forceinline__ void skip() {  // a tile past its item's rows (a narrower item than the widest)
    before_stage();  // (near_end was never reached)
    __syncthreads();
    refill();
  }
};

// lw.persistent: a launch of at most as many blocks as fit on the device at once; each block takes tickets until
// they run out (the first before its first tile, each next one near the end of the tile before). Otherwise a
// block per tile, each taking one ticket.
// LEAN: one block more per SM, with each unit's B values loaded just before its k-steps instead of one unit
// ahead (ptxas, sm_90, no spills: 1 n-tile 5 blocks in 96 registers instead of 4 in 128; 2 n-tiles 4 in 128
// instead of 3 in 168). Same arithmetic in the same order, so the same bits.
// MG, MD: 16-row tiles per warp (tc_q4_tile's MT) of the gate/up and the down tiles: a gate/up tile is 16 MG
// rows of h (32 with KSG = 1), a down tile 64 MD rows; lw's tile counts are of those. KSG: the gate/up tiles' K
// slices (TileShape; 1 only with MG = 1).
template <int FMT, int NT, bool LEAN = false, int MG = 1, int MD = 1, int KSG = 2>
__global__ void __launch_bounds__(kTcWarps * 32, tc_min_blocks(kI8Splits, NT, true) + (LEAN ? 1 : 0))
    tc_q4_layer_kernel(LayerWork lw) {
  constexpr bool kAheadB = !LEAN;
  constexpr int kGroupTiles = 64 / (kTcRowsPerBlock * TileShape<true, KSG>::kRowTiles * MG);  // per 64 rows of h
  static_assert(kGroupTiles >= 1, "gate/up tiles within a 64-row group of h");
  grid_dep_launch();
  __shared__ int s_ticket, s_last;
  __shared__ float s_stage[kTcWarps * 16 * (MG > MD ? MG : MD) * (NT * 8 + 1)];  // (tc_q4_tile's Stage)
  const int n_gu = lw.n_items * lw.gu_tiles;
  const int n_all = n_gu + lw.n_items * lw.dn_tiles;
  const int n_grp = (lw.gu_tiles + kGroupTiles - 1) / kGroupTiles;  // 64-row groups of h per item (the widest's)
  int32_t* groups_ready = lw.sync + 1;              // per item: its down operand's groups encoded
  int32_t* tiles_done = lw.sync + 1 + lw.n_items;   // per item and group: gate/up tiles finished
  if (threadIdx.x == 0) s_ticket = atomicAdd(lw.sync, 1);
  __syncthreads();
  int t = s_ticket;
  I8Regs regs;
  int primed = 0;
  // The timeline: thread 0 notes the tile's times in shared memory (no registers held across the tile) and
  // writes ticket t's record as the tile ends.
  __shared__ uint64_t s_times[kTimelineWords];
  auto mark = [&](int k) {
    if (lw.timeline != nullptr && threadIdx.x == 0) s_times[k] = global_ns();
  };
  while (t < n_all) {
    __syncthreads();  // the previous tile's shared memory (its staging, s_ticket, s_last) is read
    mark(kTimelineBegin);
    if (lw.timeline != nullptr && threadIdx.x == 0) s_times[kTimelineInputs] = 0;
    LayerCarry<FMT, MG, MD, KSG> carry{lw, regs, primed, &s_ticket, -1, n_all, s_stage};
    if (t < n_gu) {
      const int i = t / lw.gu_tiles, bx = t - i * lw.gu_tiles, grp = bx / kGroupTiles;
      tc_q4_tile<FMT, kI8Splits, NT, true, false, kAheadB, true, MG, KSG>(
          lw.items[i], bx,
          [&] {
            grid_dep_wait();
            mark(kTimelineInputs);
          },
          carry);
      mark(kTimelineStored);
      // The block's h released by thread 0's count after the barrier: one fence per block, where
      // __threadfence() in every thread cost ~1.5 us at 1-4 rows in the persistent kernel (each waited for its
      // warp's loads of the next tile; sm_90 also invalidates the SM's L1 per warp; run127). Only the group's
      // last tile acquires (the other tiles' h, for the encoding below): an acquire invalidates the SM's L1
      // (run133: 1-3 rows 0.1-0.3 us faster than an acquire-release count in every tile, within the spread).
      __syncthreads();
      if (threadIdx.x == 0) {
        int32_t* done = tiles_done + i * n_grp + grp;
        s_last = atom_add_release_gpu(done, 1) == imin(kGroupTiles, lw.gu_tiles - kGroupTiles * grp) - 1;
        if (s_last) (void)ld_acquire_gpu(done);
      }
      __syncthreads();
      const PrepJob& job = lw.dn_jobs[i];
      // The last of the group's tiles encodes it (a tile past this item's rows has no group of its operand to
      // encode; h's padding columns within the last group encode as zeros without being read: job.cols).
      if (s_last && grp < job.kp / kColPad) {
        grid_dep_wait();  // (a tile past the item's rows did not wait in the tile)
        for (int r = static_cast<int>(threadIdx.x >> 5); r < job.ncols / kI8Planes; r += kTcWarps) {
          encode_i8_unit(job, r, grp, [](const float* p) { return __ldcg(p); });
        }
        __syncthreads();
        if (threadIdx.x == 0) red_add_release_gpu(groups_ready + i, 1);
      }
    } else {
      const int d = t - n_gu, i = d / lw.dn_tiles, bx = d - i * lw.dn_tiles;
      const int need = lw.dn_jobs[i].kp / kColPad;
      tc_q4_tile<FMT, kI8Splits, NT, false, true, kAheadB, true, MD>(
          lw.items[lw.n_items + i], bx,
          [&] {
            grid_dep_wait();
            // (a wait polls without acquiring, each acquire invalidating the SM's L1, and acquires once)
            if (threadIdx.x == 0 && ld_acquire_gpu(groups_ready + i) < need) {
              while (ld_relaxed_gpu(groups_ready + i) < need) sleep_ns(64);
              (void)ld_acquire_gpu(groups_ready + i);
            }
            __syncthreads();
            mark(kTimelineInputs);
          },
          carry);
      mark(kTimelineStored);
    }
    if (lw.timeline != nullptr && threadIdx.x == 0) write_timeline(lw, t, s_times);
    t = carry.next_all;
  }
}

// Blocks of the persistent layer kernel: as many as the device holds at once (at most one per tile), or as its
// first max_sms SMs hold (max_sms > 0: bench_cuda --reserve-sms, whose other SMs are held by waiting blocks).
template <auto kernel>
int layer_blocks(int tiles, int max_sms) {
#if defined(STRATA_CUDA_EMULATE)
  (void)max_sms;
  return tiles < 3 ? tiles : 3;  // (3 blocks there, taking turns at each __syncthreads: interleaved tickets)
#else
  // Resident blocks of this instance per SM, and the SMs, on the current device (one kind of device per
  // process; a query per instance, as their registers differ); 0 when the query fails.
  static const int2 per_device = [] {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kTcWarps * 32, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      return make_int2(0, 0);
    }
    return make_int2(sms, per_sm);
  }();
  const int sms = max_sms > 0 && max_sms < per_device.x ? max_sms : per_device.x;
  const int blocks = sms * per_device.y;
  return blocks > 0 && blocks < tiles ? blocks : tiles;
#endif
}

template <auto kernel>
cudaError_t launch_layer_instance(const LayerWork& lw, const Queue& on) {
  const int tiles = lw.n_items * (lw.gu_tiles + lw.dn_tiles);
  const int blocks = lw.persistent ? layer_blocks<kernel>(tiles, lw.max_sms) : tiles;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kTcWarps * 32), on, true, lw);
}

// lean: the instance with one block more per SM (tc_q4_layer_kernel's LEAN); mg, md: its MG, MD (lw's tile
// counts of those sizes): with ksg 2 (KSG) 1 and 1, 2 and 1, or 2 and 2; with ksg 1, 1 and 1 or 1 and 2.
template <int FMT>
cudaError_t launch_tc_q4_layer(int nt, bool lean, int mg, int md, int ksg, const LayerWork& lw, const Queue& on) {
  if (lw.n_items <= 0) return cudaSuccess;
  auto with = [&](auto mg_tag, auto md_tag, auto ksg_tag) {
    constexpr int MG = decltype(mg_tag)::value, MD = decltype(md_tag)::value, K = decltype(ksg_tag)::value;
    if (nt == 1 && lean) return launch_layer_instance<&tc_q4_layer_kernel<FMT, 1, true, MG, MD, K>>(lw, on);
    if (nt == 1) return launch_layer_instance<&tc_q4_layer_kernel<FMT, 1, false, MG, MD, K>>(lw, on);
    if (nt == 2 && lean) return launch_layer_instance<&tc_q4_layer_kernel<FMT, 2, true, MG, MD, K>>(lw, on);
    if (nt == 2) return launch_layer_instance<&tc_q4_layer_kernel<FMT, 2, false, MG, MD, K>>(lw, on);
    return cudaErrorInvalidValue;
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (ksg == 1 && mg == 1 && md == 1) return with(One{}, One{}, One{});
  if (ksg == 1 && mg == 1 && md == 2) return with(One{}, Two{}, One{});
  if (ksg != 2) return cudaErrorInvalidValue;
  if (mg == 1 && md == 1) return with(One{}, One{}, Two{});
  if (mg == 2 && md == 1) return with(Two{}, One{}, Two{});
  if (mg == 2 && md == 2) return with(Two{}, Two{}, Two{});
  return cudaErrorInvalidValue;
}

}  // namespace strata_cuda
