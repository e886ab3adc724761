// Device helpers shared by the kernels: bf16 splitting of f32 values, the operand column order, silu, the
// gemv activation scaling, the gate_up epilogue store, and the few PTX instructions used (mma.sync, streaming
// loads, bf16x2 fma).
//
// With STRATA_CUDA_EMULATE the same kernel sources compile with g++ and run on the CPU (plugins/cuda/emu): warps
// as 32 fibers, the warp-collective instructions (mma.sync, shuffles, __syncwarp) emulated from their PTX
// definitions. The tests use that build to check the host side and the kernels' indexing on machines without a
// GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "work.hpp"

#if defined(STRATA_CUDA_EMULATE)
#include "emu/emu_device.hpp"
#endif

// A device function kept out of line (g++ in the emulation spells it its own way).
#if defined(STRATA_CUDA_EMULATE)
#define STRATA_NOINLINE __attribute__((noinline))
#else
#define STRATA_NOINLINE __noinline__
#endif

namespace strata_cuda {

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// Launches a kernel on on.stream (or, emulated, runs it now). `collectives`: the kernel uses warp-collective
// instructions (the emulation then runs each warp as fibers). With on.pdl the launch may begin before the
// previous kernel on the stream has finished (programmatic dependent launch, sm_90): the kernel must call
// grid_dep_wait() before it reads anything an earlier launch wrote or writes anything.
// smem: the block's dynamic shared memory in bytes (its kernel declares it with STRATA_DYN_SMEM; above 48 KB
// the kernel must have been allowed it: cudaFuncSetAttribute).
template <class... P, class... A>
cudaError_t launch_kernel_smem(void (*kernel)(P...), dim3 grid, dim3 block, unsigned smem, const Queue& on,
                               bool collectives, A... args) {
#if defined(STRATA_CUDA_EMULATE)
  if (smem > 0 && smem > static_cast<unsigned>(emu::max_dyn_smem(reinterpret_cast<const void*>(kernel))))
    return cudaErrorInvalidValue;
  // (no dependent launches before sm_90, and none with kernels built without griddepcontrol)
  if (on.pdl && (emu::sm_version() < 90 || emu::ptx_version() < 90)) return cudaErrorNotSupported;
  // (captured: the arguments as they are now, as a graph's kernel node keeps them)
  emu::enqueue(on.stream, [=] { emu::run_grid(grid, block, collectives, [&] { kernel(args...); }); });
  return cudaSuccess;
#else
  (void)collectives;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = on.stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = on.pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
#endif
}
template <class... P, class... A>
cudaError_t launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, const Queue& on, bool collectives,
                          A... args) {
  return launch_kernel_smem(kernel, grid, block, 0u, on, collectives, args...);
}
// A kernel's dynamic shared memory (the emulation: a buffer per block, poisoned when the block starts).
#if defined(STRATA_CUDA_EMULATE)
#define STRATA_DYN_SMEM(name) uint8_t* const name = ::strata_cuda::emu::dyn_smem()
#else
#define STRATA_DYN_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
#endif

// Programmatic dependent launch (PTX griddepcontrol, sm_90). grid_dep_wait: returns once the kernels this one
// depends on (the previous launch on the stream) have completed and their writes are visible; without a
// dependent launch it returns at once. grid_dep_launch: lets the next kernel's blocks be scheduled once every
// block of this one has started (or exited), so they fill the SMs this kernel's last wave leaves idle and
// start their weight loads there. Both are no-ops in the CPU emulation (it runs launches one after another).
__device__ __forceinline__ void grid_dep_wait() {
#if !defined(STRATA_CUDA_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if !defined(STRATA_CUDA_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

// Byte offset, from m.data, of byte `b` of row `row` (b: 8-byte aligned pieces stay contiguous; see DevMatrix).
// q4_tile_byte: the same for a matrix known to be in kTiles (within a row's 64 bytes of a unit, the 8-byte piece
// of group k and thread q at 16 q + 8 k).
__device__ __forceinline__ int64_t q4_tile_byte(const DevMatrix& m, int row, int b) {
  const int w = b & 63;
  return static_cast<int64_t>(row >> 4) * 16 * m.stride + ((row >> 3) & 1) * 512 + (row & 7) * 64 +
         static_cast<int64_t>(b >> 6) * 1024 + ((w >> 3) & 3) * 16 + (w >> 5) * 8 + (w & 7);
}
__device__ __forceinline__ int64_t q4_row_byte(const DevMatrix& m, int row, int b) {
  if (m.layout == kTiles) return q4_tile_byte(m, row, b);
  return static_cast<int64_t>(row) * m.stride + b;
}

// Index, in m.scales, of the Q4_G64 scale of group grp of row `row` (see DevMatrix), as a row's base plus a
// group's offset (q4_scale_row + q4_scale_grp), so streams keep one pointer per row and step by groups.
__device__ __forceinline__ int64_t q4_scale_row(const DevMatrix& m, int row) {
  const int n = m.kp / kColPad;
  if (m.layout == kTiles) return tile_scale_row(row, n);
  return static_cast<int64_t>(row) * n;
}
__device__ __forceinline__ int32_t q4_scale_grp(bool tiles, int grp) {
  return tiles ? tile_scale_grp(grp) : grp;
}
__device__ __forceinline__ int64_t q4_scale_at(const DevMatrix& m, int row, int grp) {
  return q4_scale_row(m, row) + q4_scale_grp(m.layout == kTiles, grp);
}

__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float bf16_value(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

// Part p of v split into bf16 terms: hi = bf16(v), mid = bf16(v - hi), lo = bf16(v - hi - mid). The
// subtractions are exact in f32, so hi + mid + lo equals v to about 2^-24 relative; part 0 alone is bf16(v).
__device__ __forceinline__ uint16_t split_part(float v, int p) {
  const uint16_t hi = bf16_bits(v);
  if (p == 0) return hi;
  const float r1 = v - bf16_value(hi);
  const uint16_t mid = bf16_bits(r1);
  if (p == 1) return mid;
  return bf16_bits(r1 - bf16_value(mid));
}

// Position, within its 16-column chunk, of column c of a tensor-core operand row: the 4x4 transpose
// (column s + 4t sits in slot 4s + t). It is its own inverse.
__device__ __forceinline__ int operand_slot(int c) { return (c & ~15) | ((c & 3) << 2) | ((c >> 2) & 3); }

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// The gemv kernels' activation scaling: column k of their operands holds x_k · 16^-(k % 4) (a power of two,
// so exact), which turns each nibble's dequantization into one lop3 and one fadd (gemv_q4.cuh).
__device__ __forceinline__ float gemv_x_scale(int k) { return __uint_as_float((127u - 4u * (k & 3)) << 23); }

// Where column k sits in a gemv operand row. Lane l of a warp step s reads the 16-byte weight chunk 32 s + l
// (columns 32 (32 s + l) .. + 31) and, for each quarter q = 0..7 of it, the 4 activations of columns
// 32 (32 s + l) + 4 q .. + 3 as one float4. The operand stores them at s * 1024 + q * 128 + 4 l, so each of
// the warp's float4 loads reads 512 contiguous bytes (with the plain column order the 32 lanes would touch 32
// cache lines per load, and the L1 would be the bottleneck). Rows are gemv_ld(kp) long.
__device__ __forceinline__ int gemv_slot(int k) {
  const int chunk = k >> 5;
  return (chunk >> 5) * kGemvStepCols + ((k >> 2) & 7) * 128 + (chunk & 31) * 4 + (k & 3);
}
// The column stored at a slot (the inverse of gemv_slot).
__device__ __forceinline__ int gemv_col(int slot) {
  const int chunk = (slot / kGemvStepCols) * 32 + ((slot >> 2) & 31);
  return chunk * 32 + ((slot >> 7) & 7) * 4 + (slot & 3);
}
__device__ __forceinline__ int gemv_ld(int kp) { return (kp + kGemvStepCols - 1) / kGemvStepCols * kGemvStepCols; }

// Writes h for token r, column o (o < the gate rows) into a gate_up item's output operand.
__device__ __forceinline__ void store_h(const WorkItem& it, int r, int o, float h) {
  if (it.h_splits == kGemvSplits) {
    static_cast<float*>(it.h)[static_cast<int64_t>(r) * gemv_ld(it.h_kp) + gemv_slot(o)] = h * gemv_x_scale(o);
  } else if (it.h_splits > 0) {
    uint16_t* dst = static_cast<uint16_t*>(it.h);
    const int64_t col = operand_slot(o);
    for (int p = 0; p < it.h_splits; ++p) {
      dst[static_cast<int64_t>(r * it.h_splits + p) * it.h_kp + col] = split_part(h, p);
    }
  } else {
    static_cast<float*>(it.h)[static_cast<int64_t>(r) * it.h_kp + o] = h;
  }
}

// D = A · B + C for one m16n8k16 tile, bf16 inputs, f32 accumulation (PTX ISA "mma.m16n8k16" fragment layouts:
// a0: row g k 2q..2q+1, a1: row g+8 k 2q.., a2: row g k 2q+8.., a3: row g+8 k 2q+8..; b0: k 2q..2q+1, b1: k 2q+8..
// of column g; c0,c1: row g columns 2q, 2q+1; c2,c3: row g+8; g = lane / 4, q = lane % 4).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1, float c0, float c1, float c2, float c3) {
#if defined(STRATA_CUDA_EMULATE)
  emu::mma_bf16_16816(d, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
#endif
}

// Nibbles s and s + 4 of the 32-bit word w (columns s and s + 4 of its 8) as a bf16x2 of (nibble - 8), low half
// = column s: the nibbles go into the mantissa of 128.0 (bf16 0x4300), then one fma subtracts 136 exactly.
// `magic` is 0x43004300 passed as a register the compiler cannot see through: the AND-OR is then one lop3
// (with both constants as immediates it takes two).
__device__ __forceinline__ uint32_t q4_pair_bf16x2(uint32_t w, int s, uint32_t magic) {
#if defined(STRATA_CUDA_EMULATE)
  const uint32_t v = ((w >> (4 * s)) & 0x000F000Fu) | magic;
  return emu::bf16x2_sub136(v);
#else
  uint32_t v, d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(v) : "r"(w >> (4 * s)), "n"(0x000F000F), "r"(magic));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(v), "r"(0x3F803F80u), "r"(0xC308C308u));
  return d;
#endif
}

// Exact-mode tensor-core operands (int8 digit planes, m16n8k32): where column c of an operand row of kp columns
// is stored (a byte offset in the row). Rows are read in units of 128 columns (two 64-column groups); thread q
// of a warp loads 32 bytes of a unit at 32q: columns 16q .. 16q + 15 of the unit's first group, then the same
// columns of its second, each 16 in the order of its B registers for the group's two k-steps (b0, b1 of
// k-step 0, then of k-step 1: slot s of a 16-column chunk holds column 8 (s >> 3) + 2 (s & 3) + ((s >> 2) & 1)),
// matching the A registers q4_i8_even / q4_i8_odd make from its weight words (tc_q4.cuh). A last unit of one
// group (kp / 64 odd) keeps its 16-column chunks in order (thread q's 16 bytes at 16q).
__device__ __forceinline__ int i8_pos(int c, int kp) {
  const int in16 = (c & 8) | ((c & 1) << 2) | ((c >> 1) & 3);
  const int unit = c & ~127;
  if (unit + 128 > kp) return (c & ~15) | in16;
  return unit | (((c >> 4) & 3) << 5) | (((c >> 6) & 1) << 4) | in16;
}

// Where byte pos (i8_pos) of column n of an exact-mode operand of ncols columns (8 per n-tile) and kp bytes per
// column is stored. The wide kernels' operands (ncols == 8 kWideNt, copied to shared memory by batch):
// column-major, n kp + pos. The narrow kernels' (and the layer kernel's): per n-tile t and 128-column unit u, the
// unit's bytes of the n-tile's 8 columns together in 1 KB at t 8 kp + u 1024: half h (group 0 / 1 of the unit)
// at 512 h, then column g (n % 8) at 64 g, thread q's 16 bytes of that half at 16 q. A warp's B load (thread
// (g, q) reads its 16 bytes of half h) is then 512 contiguous bytes, 4 whole cache lines, instead of 64 bytes in
// each of 8 columns' lines. A last unit of one group (kp / 64 odd) is 512 bytes: column g's 64 at 64 g.
__device__ __forceinline__ int64_t i8_at(int n, int pos, int kp, int ncols) {
  if (ncols == 8 * kWideNt) return static_cast<int64_t>(n) * kp + pos;
  const int u = pos >> 7, w = pos & 127, g = n & 7;
  const int within = (u + 1) * 128 <= kp ? ((w >> 4) & 1) * 512 + g * 64 + (w >> 5) * 16 + (w & 15) : g * 64 + w;
  return static_cast<int64_t>(n >> 3) * 8 * kp + u * 1024 + within;
}

// The even (0, 2, 4, 6) or odd (1, 3, 5, 7) nibbles of the 32-bit word w (columns 0..7 of a word), each as a
// signed byte 16 (nibble - 8): the nibble in the high half of its byte, its top bit flipped (x ^ 0x80 maps
// 16 n to 16 n - 128). Byte i is column 2i (even) or 2i + 1 (odd). `flip` is 0x80808080 passed as a register
// the compiler cannot see through (one lop3 then, instead of two).
__device__ __forceinline__ uint32_t q4_i8_bytes(uint32_t v, uint32_t flip) {
#if defined(STRATA_CUDA_EMULATE)
  return (v & 0xF0F0F0F0u) ^ flip;
#else
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(d) : "r"(v), "n"(0xF0F0F0F0), "r"(flip));
  return d;
#endif
}
__device__ __forceinline__ uint32_t q4_i8_even(uint32_t w, uint32_t flip) { return q4_i8_bytes(w << 4, flip); }
__device__ __forceinline__ uint32_t q4_i8_odd(uint32_t w, uint32_t flip) { return q4_i8_bytes(w, flip); }

// D = A · B + C for one m16n8k32 tile of signed bytes, int32 accumulation (exact) (PTX ISA "mma.m16n8k32"
// fragment layouts for .s8: a0: row g k 4q..4q+3, a1: row g+8 k 4q.., a2: row g k 16+4q.., a3: row g+8
// k 16+4q..; b0: k 4q..4q+3 of column g, b1: k 16+4q..; c0,c1: row g columns 2q, 2q+1; c2,c3: row g+8).
__device__ __forceinline__ void mma_s8_16832(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1, int32_t c0, int32_t c1, int32_t c2,
                                             int32_t c3) {
#if defined(STRATA_CUDA_EMULATE)
  emu::mma_s8_16832(d, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3);
#else
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3));
#endif
}

// 8-byte load of streamed weights: read once, so kept out of L1 (the activations live there).
__device__ __forceinline__ uint2 ld_stream_u2(const void* p) {
#if defined(STRATA_CUDA_EMULATE)
  return __ldg(static_cast<const uint2*>(p));
#else
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
#endif
}

// 16-byte load of streamed weights (the gemv kernels), kept out of L1 as above.
__device__ __forceinline__ uint4 ld_stream_u4(const void* p) {
#if defined(STRATA_CUDA_EMULATE)
  return __ldg(static_cast<const uint4*>(p));
#else
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
#endif
}

// Asynchronous copies global -> shared memory (cp.async, sm_80): 16 bytes through L2 only, or 4 bytes; each
// thread's copies since its last commit form a group, and cp_async_wait<N>() returns once at most N of its
// groups are still in flight (the copies of the others have landed; a __syncthreads then shows them to the
// block). The emulation queues the copies and carries them out at the wait (emu_device.hpp).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(STRATA_CUDA_EMULATE)
  emu::cp_async(dst, src, 16);
#else
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if defined(STRATA_CUDA_EMULATE)
  emu::cp_async(dst, src, 4);
#else
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(STRATA_CUDA_EMULATE)
  emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(STRATA_CUDA_EMULATE)
  emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// A flag between blocks of one launch, read with ld.acquire at GPU scope (the writer: a release, e.g.
// red_add_release_gpu; the emulation runs one block at a time: a plain read). sleep_ns: a pause in a wait loop (the
// emulation: another block's turn).
__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t* p) {
#if defined(STRATA_CUDA_EMULATE)
  return *p;
#else
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
// The same flag polled without acquiring (ld.relaxed: sm_90 compiles ld.acquire into the load and an
// invalidation of the SM's whole L1, CCTL.IVALL, which every other block on the SM then pays in reloaded B
// operands); a poll loop ends with one ld_acquire_gpu.
__device__ __forceinline__ int32_t ld_relaxed_gpu(const int32_t* p) {
#if defined(STRATA_CUDA_EMULATE)
  return *p;
#else
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
// A count at GPU scope by one thread after a barrier of its block: atom_add_release_gpu releases the block's
// earlier writes (cumulative through the barrier, as a cooperative grid sync's fence is) and returns the old value;
// red_add_release_gpu only releases (no result awaited). sm_90: a MEMBAR.ALL.GPU before the atomic, where
// __threadfence() in every thread is a MEMBAR.SC.GPU and a CCTL.IVALL (the SM's L1 invalidated) per warp; an
// acquire (ld_acquire_gpu, atom.acq_rel) adds a CCTL.IVALL.
__device__ __forceinline__ int32_t atom_add_release_gpu(int32_t* p, int32_t v) {
#if defined(STRATA_CUDA_EMULATE)
  const int32_t old = *p;
  *p = old + v;
  return old;
#else
  int32_t old;
  asm volatile("atom.release.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
#endif
}
__device__ __forceinline__ void red_add_release_gpu(int32_t* p, int32_t v) {
#if defined(STRATA_CUDA_EMULATE)
  *p += v;
#else
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ void sleep_ns(unsigned ns) {
#if defined(STRATA_CUDA_EMULATE)
  (void)ns;
  emu::spin_pause();
#else
  __nanosleep(ns);
#endif
}

// The device's nanosecond clock (PTX %globaltimer: one clock for every SM; its resolution is the driver's, 32 ns
// to 1 us) and the SM a block runs on; the emulation: the host's steady clock and SM 0. For the layer
// kernel's timeline (LayerWork::timeline), never for results.
__device__ __forceinline__ uint64_t global_ns() {
#if defined(STRATA_CUDA_EMULATE)
  return emu::now_ns();
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
#endif
}
__device__ __forceinline__ uint32_t sm_id() {
#if defined(STRATA_CUDA_EMULATE)
  return 0;
#else
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
  return id;
#endif
}

// Weak (plain, L1-cached) loads of data written earlier in the same launch by another block and published by
// a release/acquire pair (the layer kernel's down operand): unlike __ldg's read-only path they are ordered by
// the PTX memory model after the acquire, and unlike ld.cg they still hit in L1 (through L2 every down tile
// re-read its operand there: +18 us per GLM-5.2 layer on the H200).
__device__ __forceinline__ uint4 ld_weak_u4(const void* p) {
#if defined(STRATA_CUDA_EMULATE)
  return __ldg(static_cast<const uint4*>(p));
#else
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
#endif
}
__device__ __forceinline__ float ld_weak_f32(const float* p) {
#if defined(STRATA_CUDA_EMULATE)
  return __ldg(p);
#else
  float v;
  asm volatile("ld.global.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
  return v;
#endif
}

__device__ __forceinline__ uint2 ld_cached_u2(const void* p) { return __ldg(static_cast<const uint2*>(p)); }
__device__ __forceinline__ uint4 ld_cached_u4(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

}  // namespace strata_cuda
