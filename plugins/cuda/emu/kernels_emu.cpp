// The kernel sources, compiled with g++ for the CPU emulation (STRATA_CUDA_EMULATE; see emu.cpp).
#include "../kernels/gate_up_q4g64_tc.cu"
#include "../kernels/gate_up_q4row_tc.cu"
#include "../kernels/gate_up_simt.cu"
#include "../kernels/linear_q4g64_tc.cu"
#include "../kernels/linear_q4row_tc.cu"
#include "../kernels/linear_simt.cu"
#include "../kernels/prep_operands.cu"
