"""AR vs WeDLM benchmarks on the identical vLLM engine (see BENCHMARKS.md for results).

    python -m benchmarks offline   --model DIR --modes ar,ngram,wedlm:0.2,wedlm:0.4 --batch-sizes 1,8,64
    python -m benchmarks online    --model DIR --modes ar,wedlm:0.4 --concurrency 1,8,64
    python -m benchmarks step-cost --windows 8,16,32 --batch-sizes 1,8,64
    python -m benchmarks report    RESULTS.json [...] --out DIR

Every run writes one JSON file (rows of measurements plus the versions and the command); ratios
to AR are always taken within one run, so both sides share the engine build, the GPU and the
moment. ``report`` turns result files into markdown tables and plots.
"""
