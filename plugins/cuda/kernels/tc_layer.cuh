// The layer kernel: an expert group's gate/up tiles and down tiles (exact mode, tensor cores) in one launch.
// Each block takes a ticket (an atomic counter) and with it its work, in order: every gate/up tile of item 0,
// of item 1, .., then every down tile of item 0, 1, ... The down operand's group G (h columns 64 G ..) needs
// the 4 gate/up tiles of rows 64 G ..: the last of them to finish encodes it (encode_i8_unit, as the
// preparation pass does) and counts it; an item's down blocks load their first weights, then wait until all
// of its groups are counted. So the down tiles of the first experts run while the last gate/up tiles still
// do, with no kernel boundary, preparation launch or wave tail between the two passes; every tile's
// arithmetic is tc_q4_tile's, so the results equal the separate launches' bit for bit.
//
// No deadlock whatever the block scheduling: a block only ever waits for blocks with smaller tickets, which
// have started (they took their ticket) and never wait themselves (a gate/up tile waits only for the previous
// launch). The counters live in the group's device buffer, zeroed by the copy of the group's head before each launch.
#pragma once

#include "encode_i8.cuh"
#include "tc_q4.cuh"

namespace strata_cuda {

template <int FMT, int NT>
__global__ void __launch_bounds__(kTcWarps * 32, tc_min_blocks(kI8Splits, NT, true))
    tc_q4_layer_kernel(LayerWork lw) {
  grid_dep_launch();
  __shared__ int s_ticket, s_last;
  if (threadIdx.x == 0) s_ticket = atomicAdd(lw.sync, 1);
  __syncthreads();
  const int t = s_ticket;
  const int n_gu = lw.n_items * lw.gu_tiles;
  const int n_grp = (lw.gu_tiles + 3) / 4;          // 64-row groups of h per item (the widest item's)
  int32_t* groups_ready = lw.sync + 1;              // per item: its down operand's groups encoded
  int32_t* tiles_done = lw.sync + 1 + lw.n_items;   // per item and group: gate/up tiles finished
  if (t < n_gu) {
    const int i = t / lw.gu_tiles, bx = t - i * lw.gu_tiles, grp = bx / 4;
    tc_q4_tile<FMT, kI8Splits, NT, true>(lw.items[i], bx, [] { grid_dep_wait(); });
    __threadfence();  // this thread's h, before the count
    __syncthreads();
    if (threadIdx.x == 0) {
      s_last = atomicAdd(tiles_done + i * n_grp + grp, 1) == imin(4, lw.gu_tiles - 4 * grp) - 1;
    }
    __syncthreads();
    if (!s_last) return;
    const PrepJob job = lw.dn_jobs[i];
    if (grp >= job.kp / kColPad) return;  // tiles past this item's rows (a narrower item than the widest)
    grid_dep_wait();  // (a tile past the item's rows returned before waiting: h's padding is prep's)
    __threadfence();  // the group's other tiles' h, counted before this block's
    for (int r = static_cast<int>(threadIdx.x >> 5); r < job.ncols / kI8Planes; r += kTcWarps) {
      encode_i8_unit(job, r, grp, [](const float* p) { return __ldcg(p); });
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(groups_ready + i, 1);
  } else {
    const int d = t - n_gu, i = d / lw.dn_tiles;
    const int need = lw.dn_jobs[i].kp / kColPad;
    tc_q4_tile<FMT, kI8Splits, NT, false, true>(lw.items[lw.n_items + i], d - i * lw.dn_tiles, [&] {
      grid_dep_wait();
      if (threadIdx.x == 0) {
        while (ld_acquire_gpu(groups_ready + i) < need) sleep_ns(64);
      }
      __syncthreads();
    });
  }
}

template <int FMT>
cudaError_t launch_tc_q4_layer(int nt, const LayerWork& lw, const Queue& on) {
  if (lw.n_items <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(lw.n_items * (lw.gu_tiles + lw.dn_tiles)));
  const dim3 block(kTcWarps * 32);
  if (nt == 1) return launch_kernel(&tc_q4_layer_kernel<FMT, 1>, grid, block, on, true, lw);
  if (nt == 2) return launch_kernel(&tc_q4_layer_kernel<FMT, 2>, grid, block, on, true, lw);
  return cudaErrorInvalidValue;
}

}  // namespace strata_cuda
