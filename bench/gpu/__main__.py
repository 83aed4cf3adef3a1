from bench.gpu.cli import main

main()
