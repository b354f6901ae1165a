# The CUDA backend: library sy_cuda (kernels/cuda/*.cu, gpu/cuda_engine.cu), the GPU benchmark,
# and a function registering the GPU tests. Included after sy_engine exists, with SY_ROOT set to
# the repository root, by the top-level build and by bench/gpu_standalone (no other packages).
# CMake 3.25 does not know nvcc's C++20 flag (nvcc 12+ has it); CUDA sources follow CXX_STANDARD.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
file(GLOB SY_CUDA_SOURCES CONFIGURE_DEPENDS ${SY_ROOT}/kernels/cuda/*.cu)
add_library(sy_cuda STATIC ${SY_CUDA_SOURCES} ${SY_ROOT}/gpu/cuda_engine.cu)
# sm_90 machine code for Hopper plus PTX so that newer GPUs can still load it.
set_target_properties(sy_cuda PROPERTIES CUDA_ARCHITECTURES "90-real;90-virtual"
  CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
target_include_directories(sy_cuda PUBLIC ${SY_ROOT})
target_compile_options(sy_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror=cross-execution-space-call>)
target_link_libraries(sy_cuda PUBLIC sy_engine CUDA::cudart CUDA::cublasLt)
# Users of the engine may pick the CUDA backend: static libraries may depend on each other.
target_link_libraries(sy_engine PUBLIC sy_cuda)
target_compile_definitions(sy_engine PUBLIC SWITCHYARD_HAVE_CUDA=1)

add_executable(bench_gpu ${SY_ROOT}/bench/bench_gpu.cpp)
sy_target(bench_gpu)
target_link_libraries(bench_gpu PRIVATE sy_cuda)

# tests/gpu/test_gpu_*.cpp: Boost.Test executables that exit with 77 (CTest: skipped) when no
# device is present.
function(sy_cuda_tests models_dir binary_dir)
  file(GLOB tests CONFIGURE_DEPENDS ${SY_ROOT}/tests/gpu/test_gpu_*.cpp)
  foreach(src ${tests})
    get_filename_component(name ${src} NAME_WE)
    # Each file is a suite named after it; tests/main.cpp is the runner's main.
    add_executable(${name} ${src} ${SY_ROOT}/tests/main.cpp)
    sy_target(${name})
    target_compile_definitions(${name} PRIVATE BOOST_TEST_DYN_LINK
      SY_MODELS_DIR="${models_dir}" SY_BINARY_DIR="${binary_dir}")
    if(TARGET Boost::unit_test_framework)
      target_link_libraries(${name} PRIVATE sy_cuda sy_engine nlohmann_json::nlohmann_json
        Boost::unit_test_framework)
    else()
      # GPU-only build without Boost: the small stand-in of bench/gpu_standalone/test_shim.
      target_include_directories(${name} BEFORE PRIVATE ${SY_ROOT}/bench/gpu_standalone/test_shim)
      target_link_libraries(${name} PRIVATE sy_cuda sy_engine)
    endif()
    add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${binary_dir})
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 LABELS gpu RUN_SERIAL TRUE)
  endforeach()
endfunction()
