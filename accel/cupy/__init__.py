"""accel.cupy: the CuPy GPU backend (device arrays, cuBLAS matmuls, RawKernels where they pay).

  accel.cupy.device     CuPy arrays in and out: linear / matmul (cuBLAS), layer_norm, rms_norm,
                        softmax (RawKernels), gelu_tanh_bias (ElementwiseKernel), masked and
                        decode attention (the Numba-CUDA kernels launched on CuPy memory)
  accel.cupy.wrappers   the same with the refimpl twins' signatures, NumPy in and out (registry)
  accel.cupy.gpt2       `OPS`, an `Ops` for refimpl.gpt2 with the weights moved to the device
                        once; its array-module-agnostic glue (`make_ops`, `decode_step`) is
                        tested on the CPU with NumPy arrays and the simulated Numba-CUDA kernels;
                        decoding replays `decode_step` as a CUDA graph
  accel.cupy.llama      `OPS`, an `LlamaOps` for refimpl.llama (LLaMA, Mistral, Qwen2 / 3, Gemma / 2,
                        Phi-3) with the weights moved to the device once; `make_ops` tested on the
                        CPU as gpt2's is; decoding replays `decode_step` as a CUDA graph
  accel.cupy._cublas    cuBLAS GEMM called directly (ctypes), which may be captured into a graph

The submodules that need CuPy (device, wrappers, _kernels, _cublas, gpt2.OPS) import it themselves,
so importing this package alone needs nothing; the registry imports them only when
`accel.registry.available_backends()["cupy"]` is empty.
"""
