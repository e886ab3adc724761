// The layer kernel: an expert group's gate/up tiles and down tiles (exact mode, tensor cores) in one launch.
// Each block takes a ticket (an atomic counter) and with it its work, in order: the encoding blocks (the gate/up
// operands' digit planes from x, and the clearing of each item's h: prep_operands' jobs), then every gate/up
// tile of item 0, of item 1, .., then every down tile of item 0, 1, ... A gate/up tile loads its first weights,
// then waits until every encoding block is counted. The down operand's group G (h columns 64 G ..) needs the 4
// gate/up tiles of rows 64 G ..: the last of them to finish encodes it (encode_i8_unit, as the preparation
// pass does) and counts it; an item's down blocks load their first weights, then wait until all of its groups
// are counted. So the gate/up tiles start with the encoding and the down tiles of the first experts run while
// the last gate/up tiles still do, with no kernel boundary, preparation launch or wave tail between them;
// every encoding and every tile's arithmetic is the separate launches', so the results equal theirs bit for
// bit.
//
// No deadlock whatever the block scheduling: a block only ever waits for blocks with smaller tickets, which
// have started (they took their ticket) and never wait for a larger one (an encoding block waits only for
// the previous launch). The counters live in the group's device buffer, zeroed by the copy of the group's head
// before each launch.
#pragma once

#include "encode_i8.cuh"
#include "tc_q4.cuh"

namespace strata_cuda {

// Encoding block b of n: the units (item, token, 64-column group) of every gate/up operand, a warp each in turn,
// and its share of every item's h region cleared (the padding columns the down operand's encoding reads).
__device__ __forceinline__ void layer_encode_inputs(const LayerWork& lw, int b, int n) {
  grid_dep_wait();  // x and the items are the head's copy; nothing of the previous launch is overwritten before
  const PrepJob& j0 = lw.gu_jobs[0];
  const int n_groups = j0.kp / kColPad;
  const int per_item = (j0.ncols / kI8Planes) * n_groups;  // every item of the launch: one operand shape
  const int64_t n_units = static_cast<int64_t>(lw.n_items) * per_item;
  const int64_t n_warps = static_cast<int64_t>(n) * kLayerEncodeWarps;
  for (int64_t u = static_cast<int64_t>(b) * kLayerEncodeWarps + (threadIdx.x >> 5); u < n_units; u += n_warps) {
    const int i = static_cast<int>(u / per_item), rem = static_cast<int>(u - static_cast<int64_t>(i) * per_item);
    const int r = rem / n_groups;
    encode_i8_unit(lw.gu_jobs[i], r, rem - r * n_groups, [](const float* p) { return *p; });
  }
  const int64_t stride = static_cast<int64_t>(n) * blockDim.x;
  for (int i = 0; i < lw.n_items; ++i) {
    const PrepJob& j = lw.gu_jobs[i];
    uint4* z = static_cast<uint4*>(j.zero);
    if (z == nullptr) continue;
    for (int64_t e = static_cast<int64_t>(b) * blockDim.x + threadIdx.x; e < j.zero_bytes / 16; e += stride) {
      z[e] = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __threadfence();  // this thread's operand bytes and zeros, before the count
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(lw.sync + 1, 1);
}

// Thread 0 waits until the counter reaches `need` (ld.acquire; the producers: fence, then atomicAdd), then the
// block's barrier orders every thread's later loads after that acquire.
__device__ __forceinline__ void layer_wait_count(const int32_t* counter, int need, unsigned pause_ns) {
  if (threadIdx.x == 0) {
    while (ld_acquire_gpu(counter) < need) sleep_ns(pause_ns);
  }
  __syncthreads();
}

// ENC: lw.enc_blocks > 0 (the gate/up operands are written in this launch: weak loads, after the count);
// otherwise a preparation launch wrote them and the gate/up tiles read them as the separate launches do.
template <int FMT, int NT, bool ENC>
__global__ void __launch_bounds__(kTcWarps * 32, tc_min_blocks(kI8Splits, NT, true))
    tc_q4_layer_kernel(LayerWork lw) {
  grid_dep_launch();
  __shared__ int s_ticket, s_last;
  if (threadIdx.x == 0) s_ticket = atomicAdd(lw.sync, 1);
  __syncthreads();
  const int n_enc = ENC ? lw.enc_blocks : 0;
  if (ENC && s_ticket < n_enc) {
    layer_encode_inputs(lw, s_ticket, n_enc);
    return;
  }
  const int t = s_ticket - n_enc;
  const int n_gu = lw.n_items * lw.gu_tiles;
  const int n_grp = (lw.gu_tiles + 3) / 4;          // 64-row groups of h per item (the widest item's)
  const int32_t* inputs_ready = lw.sync + 1;        // encoding blocks done
  int32_t* groups_ready = lw.sync + 2;              // per item: its down operand's groups encoded
  int32_t* tiles_done = lw.sync + 2 + lw.n_items;   // per item and group: gate/up tiles finished
  if (t < n_gu) {
    const int i = t / lw.gu_tiles, bx = t - i * lw.gu_tiles, grp = bx / 4;
    tc_q4_tile<FMT, kI8Splits, NT, true, ENC>(lw.items[i], bx, [&] {
      grid_dep_wait();
      if (ENC) layer_wait_count(inputs_ready, n_enc, 32);
    });
    __threadfence();  // this thread's h, before the count
    __syncthreads();
    if (threadIdx.x == 0) {
      s_last = atomicAdd(tiles_done + i * n_grp + grp, 1) == imin(4, lw.gu_tiles - 4 * grp) - 1;
    }
    __syncthreads();
    if (!s_last) return;
    const PrepJob job = lw.dn_jobs[i];
    if (grp >= job.kp / kColPad) return;  // tiles past this item's rows (a narrower item than the widest)
    // A tile past the item's rows returned before waiting: h's padding (cleared by the encoding blocks or the
    // preparation launch) is ordered before this block's reads here.
    grid_dep_wait();
    if (ENC) layer_wait_count(inputs_ready, n_enc, 32);
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
      layer_wait_count(groups_ready + i, need, 64);
    });
  }
}

template <int FMT>
cudaError_t launch_tc_q4_layer(int nt, const LayerWork& lw, const Queue& on) {
  if (lw.n_items <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(lw.enc_blocks + lw.n_items * (lw.gu_tiles + lw.dn_tiles)));
  const dim3 block(kTcWarps * 32);
  const bool enc = lw.enc_blocks > 0;
  if (nt == 1) return launch_kernel(enc ? &tc_q4_layer_kernel<FMT, 1, true> : &tc_q4_layer_kernel<FMT, 1, false>,
                                    grid, block, on, true, lw);
  if (nt == 2) return launch_kernel(enc ? &tc_q4_layer_kernel<FMT, 2, true> : &tc_q4_layer_kernel<FMT, 2, false>,
                                    grid, block, on, true, lw);
  return cudaErrorInvalidValue;
}

}  // namespace strata_cuda
