from vllm_wedlm.training.train import main

main()
