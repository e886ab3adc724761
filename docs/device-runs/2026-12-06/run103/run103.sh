#!/usr/bin/env bash
# run103: staged batches (STRATA_CUDA_LAYER_STAGE=N: each layer-kernel warp's last N batches of a tile bulk-copied
# into shared memory after its first two register batches; _GU / _DN: for one kind of tile), 532233a;
# test_cuda with N=4, then the A/B over N (RESERVE=52: an H100 standing in for an H200), then timelines.
set -u
OUT0=$OUT
mkdir -p $OUT0
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
STRATA_CUDA_LAYER_STAGE=4 timeout 200 build-cuda/bundle/bin/test_cuda > $OUT0/test_cuda_stage4.log 2>&1
echo "test_cuda stage 4: exit $? $(grep -E '^\[doctest\] (test cases|assertions)' $OUT0/test_cuda_stage4.log | tr '\n' ' ')"
S=STRATA_CUDA_LAYER_STAGE
OUT=$OUT0/full TESTS=0 PASSES=2 BENCH_ARGS="--layer --quick --rounds 5 ${RESERVE:+--reserve-sms $RESERVE}" VARIANTS="- $S=2 $S=3 $S=4 $S=5 $S=6 $S=8 ${S}_GU=4 ${S}_DN=4 ${S}_GU=5,${S}_DN=3" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-600 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= VARIANTS="- $S=4 $S=5" tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -A4 "^rows" $OUT0/tl/*.txt | head -40
