#!/usr/bin/env bash
# run166 (the command line given to the device tool, kept as a script; same machine and bundle as run164-165,
# 1e1146a): the layer kernel's tile timeline with one shared operand (share 1, 1e1146a's default) and one per
# expert (share 0), full H100, 8 experts, 16-row tiles. The CSVs (2.3 MB each gzipped) are not kept; their
# summary: README.md.
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib; B=build-cuda/bundle/bin/bench_cuda
for s in 1 0; do
  echo "== timeline share $s"
  STRATA_CUDA_SHARE_OPERANDS=$s timeout 120 $B --timeline --rounds 3 --timeline-csv $OUT/tl164_share$s.csv 2>&1 |
    grep -v "^device\|^GLM" | cut -c1-300 | tail -22
  gzip -9 $OUT/tl164_share$s.csv
done
