// A CPU stand-in for the CUDA runtime and device (STRATA_CUDA_EMULATE builds): the plugin's host code and
// kernels, compiled with g++, run here unchanged, so tests on machines without a GPU check the planning,
// staging, async bookkeeping, error paths and the kernels' indexing and arithmetic. Not a model of timing or
// of the memory system: every stream operation runs at once, in order.
//
// Kernels: a warp is 32 fibers on one OS thread (a small x86-64 context switch below); each runs until its
// next warp-collective instruction, and when all 32 wait at the same one it is carried out from every lane's
// operands (mma.sync m16n8k16 by the PTX ISA fragment layouts). The warps of a block run together: a warp
// whose lanes reach __syncthreads waits until every warp of the block that has not exited is there. Device
// memory is host memory; a fake capacity (STRATA_CUDA_EMU_MEM_GB, default 16) makes out-of-memory reachable;
// STRATA_CUDA_EMU_DEVICES devices (2). Blocks run one after another, but those of a grid of at most 8 blocks
// take turns on threads of their own (see Baton). Stream capture records a stream's operations (kernel
// launches with their arguments as they were, copies, memsets) into a graph instead of running them;
// launching the instantiated graph runs them in order, as the device would (so the plugin's graph cache is
// exercised too).
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "emu_device.hpp"

#if !defined(__x86_64__)
#error "the CUDA emulation's fibers are written for x86-64"
#endif

// switch(save, load): saves the callee-saved registers and the FP control words on this stack, stores the
// stack pointer in *save, continues on `load` (a stack saved the same way, or a fresh fiber frame).
asm(R"(
  .text
  .globl strata_emu_switch
  .hidden strata_emu_switch
  .type strata_emu_switch, @function
strata_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr (%rsp)
  fnstcw 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size strata_emu_switch, .-strata_emu_switch

  .globl strata_emu_trampoline
  .hidden strata_emu_trampoline
  .type strata_emu_trampoline, @function
strata_emu_trampoline:
  movq %r12, %rdi
  call strata_emu_fiber_entry@PLT
  ud2
  .size strata_emu_trampoline, .-strata_emu_trampoline
)");

extern "C" {
void strata_emu_switch(void** save, void* load);
void strata_emu_trampoline();
__attribute__((visibility("hidden"))) void strata_emu_fiber_entry(void* fiber);
}

namespace strata_cuda::emu {
namespace {

constexpr size_t kStack = 256 * 1024;

enum Op { kNone, kSync, kShfl, kMma, kMmaS8, kBarrier };

struct Warp;

struct Fiber {
  void* sp = nullptr;
  bool done = false;
  Warp* warp = nullptr;
  std::unique_ptr<char[]> stack;
};

struct Warp {
  void* sched_sp = nullptr;
  Fiber fibers[32];
  const std::function<void()>* body = nullptr;
  int base_thread = 0;
  Op op[32];
  float shfl_in[32], shfl_out[32];
  int shfl_mask[32];
  uint32_t a[32][4], b[32][2];
  float c[32][4], d[32][4];
  int32_t ci[32][4], di[32][4];
};

thread_local Coords tls_coords;
thread_local Warp* tls_warp = nullptr;
thread_local int tls_lane = 0;

// The blocks of a small grid (up to kThreadedBlocks: the persistent layer kernel's, for one) run on OS
// threads of their own (so each has its own __shared__ variables, which are thread_local here), one at a
// time: the running block hands the baton to the next unfinished one after each __syncthreads and at each
// sleep_ns (a spin-wait's pause). So tickets taken from a counter interleave between blocks, and a block
// waiting for another's work really waits, as on the device.
constexpr unsigned kThreadedBlocks = 8;
struct Baton {
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;
  std::vector<char> done;
};
thread_local Baton* tls_baton = nullptr;
thread_local int tls_slot = 0;

// Passes the baton on (finishing: this block is done) and, unless finishing, waits until it comes back.
void hand_over(bool finishing) {
  Baton& b = *tls_baton;
  std::unique_lock<std::mutex> lock(b.mu);
  if (finishing) b.done[static_cast<size_t>(tls_slot)] = 1;
  const int n = static_cast<int>(b.done.size());
  int next = tls_slot;
  for (int k = 1; k <= n; ++k) {
    const int c = (tls_slot + k) % n;
    if (b.done[static_cast<size_t>(c)] == 0) {
      next = c;
      break;
    }
  }
  b.turn = next;
  b.cv.notify_all();
  if (!finishing) b.cv.wait(lock, [&] { return b.turn == tls_slot; });
}

void yield_to_scheduler() {
  Fiber& f = tls_warp->fibers[tls_lane];
  strata_emu_switch(&f.sp, tls_warp->sched_sp);
}

float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

void do_mma(Warp& w) {
  double A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    A[g][2 * q] = bf16_lo(w.a[l][0]);
    A[g][2 * q + 1] = bf16_hi(w.a[l][0]);
    A[g + 8][2 * q] = bf16_lo(w.a[l][1]);
    A[g + 8][2 * q + 1] = bf16_hi(w.a[l][1]);
    A[g][2 * q + 8] = bf16_lo(w.a[l][2]);
    A[g][2 * q + 9] = bf16_hi(w.a[l][2]);
    A[g + 8][2 * q + 8] = bf16_lo(w.a[l][3]);
    A[g + 8][2 * q + 9] = bf16_hi(w.a[l][3]);
    B[2 * q][g] = bf16_lo(w.b[l][0]);
    B[2 * q + 1][g] = bf16_hi(w.b[l][0]);
    B[2 * q + 8][g] = bf16_lo(w.b[l][1]);
    B[2 * q + 9][g] = bf16_hi(w.b[l][1]);
    C[g][2 * q] = w.c[l][0];
    C[g][2 * q + 1] = w.c[l][1];
    C[g + 8][2 * q] = w.c[l][2];
    C[g + 8][2 * q + 1] = w.c[l][3];
  }
  float D[16][8];
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      double s = C[m][n];
      for (int k = 0; k < 16; ++k) s += A[m][k] * B[k][n];
      D[m][n] = static_cast<float>(s);
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    w.d[l][0] = D[g][2 * q];
    w.d[l][1] = D[g][2 * q + 1];
    w.d[l][2] = D[g + 8][2 * q];
    w.d[l][3] = D[g + 8][2 * q + 1];
  }
}

int8_t byte_of(uint32_t v, int i) {
  return static_cast<int8_t>(static_cast<uint8_t>(v >> (8 * i)));
}

void do_mma_s8(Warp& w) {
  int64_t A[16][32], B[32][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    for (int i = 0; i < 4; ++i) {
      A[g][4 * q + i] = byte_of(w.a[l][0], i);
      A[g + 8][4 * q + i] = byte_of(w.a[l][1], i);
      A[g][16 + 4 * q + i] = byte_of(w.a[l][2], i);
      A[g + 8][16 + 4 * q + i] = byte_of(w.a[l][3], i);
      B[4 * q + i][g] = byte_of(w.b[l][0], i);
      B[16 + 4 * q + i][g] = byte_of(w.b[l][1], i);
    }
    C[g][2 * q] = w.ci[l][0];
    C[g][2 * q + 1] = w.ci[l][1];
    C[g + 8][2 * q] = w.ci[l][2];
    C[g + 8][2 * q + 1] = w.ci[l][3];
  }
  int32_t D[16][8];
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      int64_t s = C[m][n];
      for (int k = 0; k < 32; ++k) s += A[m][k] * B[k][n];
      D[m][n] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(s)));  // mod 2^32
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    w.di[l][0] = D[g][2 * q];
    w.di[l][1] = D[g][2 * q + 1];
    w.di[l][2] = D[g + 8][2 * q];
    w.di[l][3] = D[g + 8][2 * q + 1];
  }
}

// Each thread keeps its fiber stacks (32 per warp of the largest block run so far).
std::vector<std::unique_ptr<char[]>>& stack_pool() {
  thread_local std::vector<std::unique_ptr<char[]>> pool;
  return pool;
}

// Sets up warp w's 32 fibers on stacks [32 w_index, 32 w_index + 32) of the pool.
void start_warp(Warp& w, int w_index) {
  auto& pool = stack_pool();
  while (pool.size() < static_cast<size_t>(32 * (w_index + 1)))
    pool.push_back(std::unique_ptr<char[]>(new char[kStack]));  // (not zeroed: pages only as used)
  for (int l = 0; l < 32; ++l) {
    Fiber& f = w.fibers[l];
    f.done = false;
    f.warp = &w;
    // A fresh frame for strata_emu_switch to "return" into the trampoline, with r12 = the fiber.
    const uintptr_t top =
        (reinterpret_cast<uintptr_t>(pool[static_cast<size_t>(32 * w_index + l)].get()) + kStack) &
        ~uintptr_t{15};
    uint64_t* sp = reinterpret_cast<uint64_t*>(top - 88);
    std::memset(sp, 0, 88);
    const uint32_t mxcsr = 0x1f80;
    const uint16_t fpcw = 0x037f;
    std::memcpy(reinterpret_cast<char*>(sp), &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(sp) + 8, &fpcw, 2);
    sp[5] = reinterpret_cast<uint64_t>(&f);                      // r12
    sp[8] = reinterpret_cast<uint64_t>(&strata_emu_trampoline);  // return address
    f.sp = sp;
  }
}

// Runs warp w until it finishes (true) or all its lanes wait at __syncthreads (false); warp collectives are
// carried out on the way.
bool step_warp(Warp& w) {
  Warp* saved_warp = tls_warp;
  tls_warp = &w;
  bool finished = false;
  for (;;) {
    int done = 0;
    for (int l = 0; l < 32; ++l) {
      if (w.fibers[l].done) {
        ++done;
        continue;
      }
      w.op[l] = kNone;
      tls_lane = l;
      tls_coords.thread_idx = make_uint3(static_cast<unsigned>(w.base_thread + l), 0, 0);
      strata_emu_switch(&w.sched_sp, w.fibers[l].sp);
      if (w.fibers[l].done) ++done;
    }
    if (done == 32) {
      finished = true;
      break;
    }
    if (done != 0) die("warp divergence: some lanes finished while others wait at a collective");
    const Op op = w.op[0];
    for (int l = 1; l < 32; ++l) {
      if (w.op[l] != op) die("warp divergence: lanes wait at different collectives");
    }
    if (op == kBarrier) break;
    if (op == kShfl) {
      for (int l = 0; l < 32; ++l) w.shfl_out[l] = w.shfl_in[l ^ (w.shfl_mask[l] & 31)];
    } else if (op == kMma) {
      do_mma(w);
    } else if (op == kMmaS8) {
      do_mma_s8(w);
    } else if (op != kSync) {
      die("fiber yielded without a collective");
    }
  }
  tls_warp = saved_warp;
  return finished;
}

// Runs the warps of one block: each up to its next __syncthreads (or its end), then all waiting ones go on.
void run_block(int n_warps, const std::function<void()>& body) {
  std::vector<std::unique_ptr<Warp>> warps;
  for (int wi = 0; wi < n_warps; ++wi) {
    warps.push_back(std::make_unique<Warp>());
    warps.back()->body = &body;
    warps.back()->base_thread = wi * 32;
    start_warp(*warps.back(), wi);
  }
  std::vector<bool> finished(static_cast<size_t>(n_warps), false);
  for (;;) {
    int running = 0;
    for (int wi = 0; wi < n_warps; ++wi) {
      if (finished[static_cast<size_t>(wi)]) continue;
      finished[static_cast<size_t>(wi)] = step_warp(*warps[static_cast<size_t>(wi)]);
      if (!finished[static_cast<size_t>(wi)]) ++running;
    }
    if (running == 0) break;
    if (tls_baton != nullptr) hand_over(false);  // (a __syncthreads: another block's turn)
  }
}

}  // namespace

void die(const char* what) {
  std::fprintf(stderr, "strata CUDA emulation: %s\n", what);
  std::abort();
}

Coords& coords() {
  return tls_coords;
}

namespace {
std::atomic<uint64_t> g_launches{0};

// A block's dynamic shared memory and each of its threads' cp.async queues (per OS thread: one block at a time).
struct CpCopy {
  void* dst;
  const void* src;
  int bytes;
};
struct CpThread {
  std::vector<CpCopy> open;                  // since the last commit
  std::deque<std::vector<CpCopy>> groups;    // committed, oldest first
};
struct BlockLocal {
  uint64_t launch = ~uint64_t{0};
  uint3 block{~0u, ~0u, ~0u};
  std::vector<uint8_t> smem;
  std::vector<CpThread> cp;
};
thread_local BlockLocal tls_block;

BlockLocal& block_local() {
  BlockLocal& b = tls_block;
  const Coords& c = tls_coords;
  if (b.launch != c.launch || b.block.x != c.block_idx.x || b.block.y != c.block_idx.y) {
    b.launch = c.launch;
    b.block = c.block_idx;
    b.smem.assign(static_cast<size_t>(max_smem_optin()), 0xA5);
    b.cp.assign(c.block_dim.x, CpThread{});
  }
  return b;
}

std::mutex g_attr_mu;
std::map<const void*, int> g_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel
}  // namespace

uint8_t* dyn_smem() {
  return block_local().smem.data();
}

void cp_async(void* dst, const void* src, int bytes) {
  if ((bytes != 4 && bytes != 8 && bytes != 16) || reinterpret_cast<uintptr_t>(dst) % bytes != 0 ||
      reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    die("cp.async of a size other than 4, 8, 16 or a misaligned address");
  }
  BlockLocal& b = block_local();
  uint8_t* lo = b.smem.data();
  if (static_cast<uint8_t*>(dst) < lo || static_cast<uint8_t*>(dst) + bytes > lo + b.smem.size()) {
    die("cp.async outside the block's dynamic shared memory");
  }
  b.cp[tls_coords.thread_idx.x].open.push_back(CpCopy{dst, src, bytes});
}

void cp_async_commit() {
  CpThread& t = block_local().cp[tls_coords.thread_idx.x];
  t.groups.push_back(std::move(t.open));
  t.open.clear();
}

void cp_async_wait(int n) {
  CpThread& t = block_local().cp[tls_coords.thread_idx.x];
  while (static_cast<int>(t.groups.size()) > n) {
    for (const CpCopy& c : t.groups.front()) std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
    t.groups.pop_front();
  }
}

int max_dyn_smem(const void* kernel) {
  if (const char* v = std::getenv("STRATA_CUDA_EMU_NO_DYN_SMEM"); v != nullptr && std::strcmp(v, "1") == 0) return 0;
  std::lock_guard<std::mutex> lock(g_attr_mu);
  const auto it = g_dyn_smem.find(kernel);
  return it != g_dyn_smem.end() ? it->second : 48 * 1024;
}

void run_grid(dim3 grid, dim3 block, bool collectives, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  const uint64_t launch = g_launches.fetch_add(1) + 1;
  tls_coords.launch = launch;
  if (block.y != 1 || block.z != 1 || grid.z != 1) die("only 1-D blocks and 2-D grids are emulated");
  if (collectives && threads % 32 != 0) die("blocks of whole warps only");
  tls_coords.block_dim = block;
  tls_coords.grid_dim = grid;
  const unsigned n_blocks = grid.x * grid.y;
  if (collectives && n_blocks > 1 && n_blocks <= kThreadedBlocks) {
    Baton baton;
    baton.done.assign(n_blocks, 0);
    std::vector<std::thread> blocks;
    for (unsigned k = 0; k < n_blocks; ++k) {
      blocks.emplace_back([&, k] {
        tls_coords.block_dim = block;
        tls_coords.grid_dim = grid;
        tls_coords.launch = launch;
        tls_coords.block_idx = make_uint3(k % grid.x, k / grid.x, 0);
        tls_baton = &baton;
        tls_slot = static_cast<int>(k);
        {
          std::unique_lock<std::mutex> lock(baton.mu);
          baton.cv.wait(lock, [&] { return baton.turn == static_cast<int>(k); });
        }
        run_block(static_cast<int>(threads / 32), body);
        hand_over(true);
        tls_baton = nullptr;
      });
    }
    for (std::thread& t : blocks) t.join();
    return;
  }
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      tls_coords.block_idx = make_uint3(bx, by, 0);
      if (!collectives) {
        for (unsigned t = 0; t < threads; ++t) {
          tls_coords.thread_idx = make_uint3(t, 0, 0);
          body();
        }
        continue;
      }
      run_block(static_cast<int>(threads / 32), body);
    }
  }
}

void syncwarp() {
  if (tls_warp == nullptr) die("__syncwarp outside a warp");
  tls_warp->op[tls_lane] = kSync;
  yield_to_scheduler();
}

void spin_pause() {
  if (tls_baton == nullptr)
    die("a spin-wait in a grid whose blocks run one after another: it would never end");
  hand_over(false);
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void syncthreads() {
  if (tls_warp == nullptr) die("__syncthreads outside a block of warps");
  tls_warp->op[tls_lane] = kBarrier;
  yield_to_scheduler();
}

float shfl_xor(float v, int lane_mask) {
  if (tls_warp == nullptr) die("shuffle outside a warp");
  Warp& w = *tls_warp;
  const int l = tls_lane;
  w.shfl_in[l] = v;
  w.shfl_mask[l] = lane_mask;
  w.op[l] = kShfl;
  yield_to_scheduler();
  return tls_warp->shfl_out[tls_lane];
}

void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                    uint32_t b1, float c0, float c1, float c2, float c3) {
  if (tls_warp == nullptr) die("mma outside a warp");
  Warp& w = *tls_warp;
  const int l = tls_lane;
  w.a[l][0] = a0;
  w.a[l][1] = a1;
  w.a[l][2] = a2;
  w.a[l][3] = a3;
  w.b[l][0] = b0;
  w.b[l][1] = b1;
  w.c[l][0] = c0;
  w.c[l][1] = c1;
  w.c[l][2] = c2;
  w.c[l][3] = c3;
  w.op[l] = kMma;
  yield_to_scheduler();
  for (int i = 0; i < 4; ++i) d[i] = tls_warp->d[tls_lane][i];
}

void mma_s8_16832(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                  uint32_t b1, int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  if (tls_warp == nullptr) die("mma outside a warp");
  Warp& w = *tls_warp;
  const int l = tls_lane;
  w.a[l][0] = a0;
  w.a[l][1] = a1;
  w.a[l][2] = a2;
  w.a[l][3] = a3;
  w.b[l][0] = b0;
  w.b[l][1] = b1;
  w.ci[l][0] = c0;
  w.ci[l][1] = c1;
  w.ci[l][2] = c2;
  w.ci[l][3] = c3;
  w.op[l] = kMmaS8;
  yield_to_scheduler();
  for (int i = 0; i < 4; ++i) d[i] = tls_warp->di[tls_lane][i];
}

uint32_t bf16x2_sub136(uint32_t v) {
  auto one = [](uint32_t h) -> uint32_t {
    const float f = __uint_as_float(h << 16) - 136.0f;  // exact for the nibble values
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0xffffu) != 0) die("bf16x2_sub136: inexact");
    return u >> 16;
  };
  return one(v & 0xffffu) | (one(v >> 16) << 16);
}

}  // namespace strata_cuda::emu

extern "C" void strata_emu_fiber_entry(void* p) {
  auto* f = static_cast<strata_cuda::emu::Fiber*>(p);
  (*f->warp->body)();
  f->done = true;
  strata_emu_switch(&f->sp, f->warp->sched_sp);
  strata_cuda::emu::die("a finished fiber was resumed");
}

// ---- the runtime API subset the plugin uses
// ------------------------------------------------------------------

namespace {

struct Runtime {
  std::mutex mu;
  std::map<const void*, size_t> device_allocs;
  std::map<const void*, size_t> host_allocs;  // pinned (cudaHostAlloc)
  size_t device_bytes = 0;
  size_t capacity = 0;
  int devices = 2;
  Runtime() {
    double gb = 16;
    if (const char* v = std::getenv("STRATA_CUDA_EMU_MEM_GB")) gb = std::atof(v);
    capacity = static_cast<size_t>(gb * 1024 * 1024 * 1024);
    if (const char* v = std::getenv("STRATA_CUDA_EMU_DEVICES")) devices = std::atoi(v);
  }
};

Runtime& rt() {
  static Runtime r;
  return r;
}

thread_local int tls_device = 0;
thread_local cudaError_t tls_last = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  tls_last = e;
  return e;
}

// A stream: while capturing, the graph its operations go to.
struct Graph {
  std::vector<std::function<void()>> ops;
};
struct Stream {
  Graph* capture = nullptr;
};
Stream* stream_of(cudaStream_t s) {
  return reinterpret_cast<Stream*>(s);
}
bool capturing(cudaStream_t s) {
  // (0, cudaStreamLegacy and cudaStreamPerThread are not streams of ours and never capture here)
  return reinterpret_cast<uintptr_t>(s) > 0xFF && stream_of(s)->capture != nullptr;
}

}  // namespace

namespace strata_cuda::emu {

int sm_version() {
  const char* v = std::getenv("STRATA_CUDA_EMU_SM");  // (an integer: 86, not 8.6)
  const int sm = v != nullptr ? std::atoi(v) : 90;
  return sm >= 10 ? sm : 90;
}

int max_smem_optin() {
  const int sm = sm_version();
  return sm == 80 || sm == 87 ? 163 * 1024 : sm == 90 || sm == 100 ? 227 * 1024 : 99 * 1024;
}

int ptx_version() {
  const char* v = std::getenv("STRATA_CUDA_EMU_PTX");
  const int ptx = v != nullptr ? std::atoi(v) : 0;
  return ptx >= 10 ? ptx : sm_version();
}

void enqueue(cudaStream_t s, std::function<void()> op) {
  if (capturing(s))
    stream_of(s)->capture->ops.push_back(std::move(op));
  else
    op();
}

}  // namespace strata_cuda::emu

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = rt().devices;
  return rt().devices > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = tls_last;
  tls_last = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    default:
      return "unknown error";
  }
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= rt().devices) return fail(cudaErrorInvalidDevice);
  if (attr == cudaDevAttrComputeCapabilityMajor)
    *value = strata_cuda::emu::sm_version() / 10;
  else if (attr == cudaDevAttrComputeCapabilityMinor)
    *value = strata_cuda::emu::sm_version() % 10;
  else if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin)
    *value = strata_cuda::emu::max_smem_optin();
  else
    *value = 0;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > strata_cuda::emu::max_smem_optin()) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(strata_cuda::emu::g_attr_mu);
  strata_cuda::emu::g_dyn_smem[func] = value;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = tls_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= rt().devices) return fail(cudaErrorInvalidDevice);
  tls_device = device;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  *p = nullptr;
  if (bytes > r.capacity - r.device_bytes) return fail(cudaErrorMemoryAllocation);
  void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (m == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(m, 0xFF,
              bytes);  // fresh device memory is not zero: NaN in every float format, so reads of it show
  r.device_allocs[m] = bytes;
  r.device_bytes += bytes;
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.device_allocs.find(p);
  if (it == r.device_allocs.end()) return fail(cudaErrorInvalidValue);
  r.device_bytes -= it->second;
  r.device_allocs.erase(it);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (*p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(*p, 0xFF, bytes);
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.host_allocs[*p] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.host_allocs.find(p);
  if (it == r.host_allocs.end()) return fail(cudaErrorInvalidValue);
  std::memset(p, 0xFF, it->second);  // NaN bytes: a copy that still reads the freed buffer shows in results
  r.host_allocs.erase(it);
  std::free(p);
  return cudaSuccess;
}
// Registration pins nothing here (host memory is the device's); the emulated copies read and write it as is.
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
  return p == nullptr || bytes == 0 ? fail(cudaErrorInvalidValue) : cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  return p == nullptr ? fail(cudaErrorInvalidValue) : cudaSuccess;
}
// The device's address of registered host memory: the host's own here (as with the real driver on most UVA
// systems).
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int) {
  if (dev == nullptr || host == nullptr) return fail(cudaErrorInvalidValue);
  *dev = host;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  *total_b = r.capacity;
  *free_b = r.capacity - r.device_bytes;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new Stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (capturing(s)) return fail(cudaErrorStreamCaptureUnsupported);
  delete stream_of(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return capturing(s) ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode) {
  if (reinterpret_cast<uintptr_t>(s) <= 0xFF) return fail(cudaErrorStreamCaptureUnsupported);  // (legacy)
  if (capturing(s)) return fail(cudaErrorIllegalState);
  stream_of(s)->capture = new Graph;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (!capturing(s)) return fail(cudaErrorIllegalState);
  *graph = reinterpret_cast<cudaGraph_t>(stream_of(s)->capture);
  stream_of(s)->capture = nullptr;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = reinterpret_cast<cudaGraphExec_t>(new Graph(*reinterpret_cast<Graph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Graph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<Graph*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (capturing(s)) return fail(cudaErrorStreamCaptureUnsupported);  // (a child graph: not used)
  for (const auto& op : reinterpret_cast<Graph*>(exec)->ops) op();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new int(0));
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  return cudaEventCreate(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<int*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t s) {
  return capturing(s) ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;  // (not used while capturing)
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) {  // the emulated stream runs every call at once
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0;
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  strata_cuda::emu::enqueue(s, [=] {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                              size_t height, cudaMemcpyKind, cudaStream_t s) {
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue);
  strata_cuda::emu::enqueue(s, [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    }
  });
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= rt().devices) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "strata CUDA emulation");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->totalGlobalMem = rt().capacity;
  prop->l2CacheSize = 0;
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  strata_cuda::emu::enqueue(s, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

}  // extern "C"
