# The CUDA emulator build (tests/emu): the unmodified CUDA sources (kernels/cuda/*.cu,
# gpu/cuda_engine.cu) compiled by the host compiler against the emulator's headers, and the GPU
# tests (tests/gpu/test_gpu_*.cpp) linked against them as emu_test_gpu_*. They run on any Linux
# machine, GPU or not, so every CI run executes the CUDA backend's logic; the device tests stay
# the judge of real behaviour. No CUDA toolkit is needed.
set(_emu ${PROJECT_SOURCE_DIR}/tests/emu)
find_package(Python3 REQUIRED COMPONENTS Interpreter)

file(GLOB _emu_cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
list(APPEND _emu_cu ${PROJECT_SOURCE_DIR}/gpu/cuda_engine.cu)
set(_emu_generated "")
foreach(cu ${_emu_cu})
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${cu})
  string(REGEX REPLACE "\\.cu$" ".cpp" rel ${rel})
  set(out ${PROJECT_BINARY_DIR}/emu_src/${rel})
  add_custom_command(OUTPUT ${out}
    COMMAND ${Python3_EXECUTABLE} ${_emu}/rewrite_cu.py ${cu} ${out}
    DEPENDS ${cu} ${_emu}/rewrite_cu.py
    COMMENT "CUDA emulator: rewriting ${rel}")
  list(APPEND _emu_generated ${out})
endforeach()

# The emulated device and the CUDA sources on it. __CUDACC__ exposes the device parts of our
# headers, as nvcc would; only these files see it.
add_library(sy_cuda_emu STATIC ${_emu_generated} ${_emu}/emu_runtime.cpp ${_emu}/emu_cublaslt.cpp)
target_include_directories(sy_cuda_emu BEFORE PUBLIC ${_emu}/include)
target_include_directories(sy_cuda_emu PUBLIC ${PROJECT_SOURCE_DIR} PRIVATE ${_emu})
target_compile_options(sy_cuda_emu PRIVATE ${SY_WARNINGS} ${SY_ARCH_FLAGS}
  -Wno-unknown-pragmas)  # `#pragma unroll` is for nvcc
set_source_files_properties(${_emu_generated} PROPERTIES COMPILE_DEFINITIONS "__CUDACC__")

# The engine library again, without the real CUDA backend behind it.
file(GLOB _emu_engine CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/gpu/*.cpp)
add_library(sy_engine_emu STATIC ${_emu_engine})
sy_target(sy_engine_emu)
target_link_libraries(sy_engine_emu PUBLIC sy_model sy_kernels sy_policies)
target_compile_definitions(sy_engine_emu PUBLIC SWITCHYARD_HAVE_CUDA=1)
target_link_libraries(sy_cuda_emu PUBLIC sy_engine_emu)
target_link_libraries(sy_engine_emu PUBLIC sy_cuda_emu)

# The GPU tests on the emulator, in one executable: entry emu_test_gpu_x runs suite test_gpu_x.
file(GLOB _emu_tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/gpu/test_gpu_*.cpp)
add_executable(emu_gpu_tests ${_emu_tests})
sy_test_target(emu_gpu_tests)
target_link_libraries(emu_gpu_tests PRIVATE sy_cuda_emu sy_engine_emu)
# Tells the tests they run here: a test may then do less of work that only repeats what it has
# already covered (each says why), since every kernel thread here costs a fiber's run on the CPU.
target_compile_definitions(emu_gpu_tests PRIVATE SY_CUDA_EMULATOR=1)
foreach(src ${_emu_tests})
  get_filename_component(name ${src} NAME_WE)
  # Boost.Test's own signal handlers would hide the emulator's report of a bad access.
  add_test(NAME emu_${name} COMMAND emu_gpu_tests --run_test=${name} --catch_system_errors=no
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(emu_${name} PROPERTIES LABELS emu TIMEOUT 1200)
endforeach()
# The longest entry by far (minutes on two cores): a cost hint makes CTest start it first, beside
# the short ones, instead of last and alone. Only the order changes.
set_tests_properties(emu_test_gpu_engine PROPERTIES COST 1000)

# The emulator's own tests: kernels with planted bugs it must catch.
set(_emu_self ${PROJECT_BINARY_DIR}/emu_src/tests/emu/selftest_kernels.cpp)
add_custom_command(OUTPUT ${_emu_self}
  COMMAND ${Python3_EXECUTABLE} ${_emu}/rewrite_cu.py ${_emu}/selftest_kernels.cu ${_emu_self}
  DEPENDS ${_emu}/selftest_kernels.cu ${_emu}/rewrite_cu.py
  COMMENT "CUDA emulator: rewriting tests/emu/selftest_kernels.cu")
set_source_files_properties(${_emu_self} PROPERTIES COMPILE_DEFINITIONS "__CUDACC__")
target_sources(emu_gpu_tests PRIVATE ${_emu}/test_emu_runtime.cpp ${_emu_self})
target_include_directories(emu_gpu_tests PRIVATE ${_emu})
set_source_files_properties(${_emu_self} ${_emu}/test_emu_runtime.cpp PROPERTIES
  COMPILE_OPTIONS -Wno-unknown-pragmas)
add_test(NAME emu_test_runtime COMMAND emu_gpu_tests --run_test=test_emu_runtime
  --catch_system_errors=no WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(emu_test_runtime PROPERTIES LABELS emu)

# The device check's benchmark on the emulator, at a toy shape (--tiny): a smoke run of its code
# paths (graphs, Q8_0 decode, the JSON), so that a bug in it shows here before it costs a rented
# GPU's time. Its figures mean nothing; exit 0 and a written JSON are the pass.
add_executable(emu_bench_gpu ${PROJECT_SOURCE_DIR}/bench/bench_gpu.cpp)
sy_target(emu_bench_gpu)
target_link_libraries(emu_bench_gpu PRIVATE sy_cuda_emu sy_engine_emu)
# The check, as a script: the JSON is removed first, so a stale file from an earlier run cannot
# pass for this one.
set(_emu_bench_check ${PROJECT_BINARY_DIR}/emu_bench_gpu_tiny.cmake)
file(WRITE ${_emu_bench_check} [=[
file(REMOVE ${JSON})
execute_process(COMMAND ${EXE} --tiny --json ${JSON} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "emu_bench_gpu --tiny failed: ${rc}")
endif()
if(NOT EXISTS ${JSON})
  message(FATAL_ERROR "emu_bench_gpu --tiny wrote no ${JSON}")
endif()
]=])
add_test(NAME emu_bench_gpu_tiny
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:emu_bench_gpu>
    -DJSON=${PROJECT_BINARY_DIR}/emu_bench_gpu_tiny.json -P ${_emu_bench_check}
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(emu_bench_gpu_tiny PROPERTIES LABELS emu TIMEOUT 600)

# The server itself on the emulated device: `emu_switchyard` is the switchyard command with the
# emulator's engine libraries first on the link line (the real ones are then never pulled in),
# so `--backend auto` finds one CUDA device. The golden test runs against it unchanged: greedy ids
# through sockets, actors, batcher and the CUDA executor equal llama.cpp's.
file(GLOB _emu_cli CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/cli/*.cpp)
add_executable(emu_switchyard ${_emu_cli})
sy_target(emu_switchyard)
target_link_libraries(emu_switchyard PRIVATE sy_engine_emu sy_cuda_emu sy_server sy_client
  CLI11::CLI11 nlohmann_json::nlohmann_json)
# Beside the real binary, where the integration tests look (SY_BINARY_DIR).
set_target_properties(emu_switchyard PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
add_dependencies(integration_tests emu_switchyard)
add_test(NAME emu_it_test_golden COMMAND integration_tests --run_test=test_golden
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
# COST: started among the first, so that its minute runs beside the unit tests instead of alone
# at the end, after the other server tests that share its lock.
set_tests_properties(emu_it_test_golden PROPERTIES LABELS emu TIMEOUT 1200 RESOURCE_LOCK server
  COST 500
  ENVIRONMENT SY_SERVER_BINARY=emu_switchyard)

# GPU telemetry with the server on the emulated device: the NVML stand-in's switchyard_gpu_*
# series (tests/python/test_tracing.py, its GPU case; docs/metrics.md).
add_test(NAME emu_python_tracing_gpu
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/python/test_tracing.py
    --binary $<TARGET_FILE:emu_switchyard> --models ${SY_MODELS_DIR})
set_tests_properties(emu_python_tracing_gpu PROPERTIES LABELS emu TIMEOUT 300
  RESOURCE_LOCK server ENVIRONMENT "SY_CASE=gpu_series;SY_EXPECT_BACKEND=cuda")

# The server on the emulated device with stories260K and `flags` (spliced into its command line),
# whose CUDA engine cannot be built: it must print `switchyard: error: <error>...` and exit 1
# instead of saying "ready" with no executor.
function(sy_emu_serve_refused name flags error)
  add_test(NAME ${name}
    COMMAND sh -c "out=$(\"$0\" serve --model \"$1\" --bind tcp://127.0.0.1:* --no-journal ${flags} 2>&1); rc=$?; echo \"$out\" | tr '\\n' ' '; echo \" exit=$rc\""
      $<TARGET_FILE:emu_switchyard> ${SY_MODELS_DIR}/stories260K.gguf)
  set_tests_properties(${name} PROPERTIES LABELS emu TIMEOUT 120
    PASS_REGULAR_EXPRESSION "switchyard: error: ${error}[^\n]* exit=1")
endfunction()
# A KV cache that cannot fit the (2 GiB) emulated device.
sy_emu_serve_refused(emu_serve_kv_does_not_fit "--kv-mb 4000" "model does not fit")
# A cache type with no CUDA kernels (batching.kv_dtype q8_0).
sy_emu_serve_refused(emu_serve_kv_dtype_q8_0_refused "--kv-dtype q8_0"
  "cuda backend does not support batching.kv_dtype q8_0 yet")
