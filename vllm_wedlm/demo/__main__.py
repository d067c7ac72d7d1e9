from vllm_wedlm.demo.server import main

if __name__ == "__main__":
    main()
