// The CUDA emulator's own checks: each finds the bug it is there to find (a missing barrier, a
// read before synchronizing, host code touching device memory, a deadlock, a misaligned tile,
// too much shared memory, a wrong cuBLASLt layout), and correct code runs as on a device.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <functional>
#include <string>
#include <vector>

#include "selftest_kernels.hpp"

BOOST_AUTO_TEST_SUITE(test_emu_runtime)

namespace {

using namespace sy::emutest;

template <class T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaMemcpy(h.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

/// Runs fn in a child process; returns what it wrote to stderr and whether a signal ended it.
struct Death {
  bool signalled = false;
  std::string err;
};
Death run_child(const std::function<void()>& fn) {
  int fds[2];
  BOOST_REQUIRE_EQUAL(pipe(fds), 0);
  const pid_t pid = fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);  // got through: the check it was meant to trip did not fire
  }
  close(fds[1]);
  Death d;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) d.err.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  d.signalled = WIFSIGNALED(status);
  return d;
}

BOOST_AUTO_TEST_CASE(a_missing_barrier_shows_as_wrong_values) {
  int* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(int) * 63), cudaSuccess);
  BOOST_REQUIRE_EQUAL(neighbour_read(out, true, nullptr), cudaSuccess);
  const std::vector<int> good = download(out, 63);
  for (int t = 0; t < 63; ++t) BOOST_TEST(good[static_cast<size_t>(t)] == t + 2);
  BOOST_REQUIRE_EQUAL(neighbour_read(out, false, nullptr), cudaSuccess);
  const std::vector<int> racy = download(out, 63);
  int wrong = 0;
  for (int t = 0; t < 63; ++t) wrong += racy[static_cast<size_t>(t)] != t + 2;
  BOOST_TEST(wrong > 0);  // the neighbour's cell was read before it was written
  cudaFree(out);
}

BOOST_AUTO_TEST_CASE(warp_shuffles_and_early_exits) {
  std::vector<float> h(96);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i);
  float *in = nullptr, *sums = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&in, sizeof(float) * 96), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaMalloc(&sums, sizeof(float) * 3), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaMemcpy(in, h.data(), sizeof(float) * 96, cudaMemcpyHostToDevice),
                      cudaSuccess);
  BOOST_REQUIRE_EQUAL(warp_sums(in, sums, 3, nullptr), cudaSuccess);
  const std::vector<float> s = download(sums, 3);
  for (int w = 0; w < 3; ++w) BOOST_TEST(s[static_cast<size_t>(w)] == 32.0f * 32 * w + 496.0f);

  int* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(int) * 64), cudaSuccess);
  BOOST_REQUIRE_EQUAL(early_exit(out, 40, nullptr), cudaSuccess);
  const std::vector<int> e = download(out, 64);
  for (int t = 0; t < 40; ++t) BOOST_TEST(e[static_cast<size_t>(t)] == 40);
  BOOST_TEST(e[40] == -1);  // never written: still the poison of fresh device memory
  cudaFree(in);
  cudaFree(sums);
  cudaFree(out);
}

BOOST_AUTO_TEST_CASE(work_runs_only_when_synchronized) {
  cudaStream_t s = nullptr;
  BOOST_REQUIRE_EQUAL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(int)), cudaSuccess);
  BOOST_REQUIRE_EQUAL(store_value(out, 7, s), cudaSuccess);
  int h = 0;
  // A synchronous copy does not wait for a non-blocking stream: the kernel has not run yet.
  BOOST_REQUIRE_EQUAL(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  BOOST_TEST(h == -1);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  BOOST_TEST(h == 7);
  cudaFree(out);
  cudaStreamDestroy(s);
}

BOOST_AUTO_TEST_CASE(graphs_replay_the_arguments_of_the_capture) {
  cudaStream_t s = nullptr;
  BOOST_REQUIRE_EQUAL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(int)), cudaSuccess);
  int value = 5;
  BOOST_REQUIRE_EQUAL(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  BOOST_REQUIRE_EQUAL(store_value(out, value, s), cudaSuccess);
  cudaGraph_t g = nullptr;
  BOOST_REQUIRE_EQUAL(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  value = 9;  // too late: the graph holds 5
  BOOST_REQUIRE_EQUAL(cudaGraphLaunch(exec, s), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  int h = 0;
  BOOST_REQUIRE_EQUAL(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  BOOST_TEST(h == 5);
  // Synchronizing a capturing stream is refused and ends the capture.
  BOOST_REQUIRE_EQUAL(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  BOOST_TEST(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  BOOST_TEST(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFree(out);
  cudaStreamDestroy(s);
}

BOOST_AUTO_TEST_CASE(launch_limits_are_the_devices) {
  int* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(int)), cudaSuccess);
  // Above 48 KB without opting in: refused at the launch.
  BOOST_TEST(big_smem(out, 64 * 1024, false, nullptr) == cudaErrorInvalidValue);
  BOOST_TEST(cudaGetLastError() == cudaSuccess);  // reading the error cleared it
  BOOST_TEST(big_smem(out, 64 * 1024, true, nullptr) == cudaSuccess);
  BOOST_TEST(download(out, 1)[0] == 1);
  // Above Hopper's 227 KB even the opt-in is refused.
  BOOST_TEST(big_smem(out, 240 * 1024, true, nullptr) == cudaErrorInvalidValue);
  // A pageable host pointer handed to a kernel would fault on a device: refused.
  std::vector<int> host(4);
  BOOST_TEST(store_value(host.data(), 1, nullptr) == cudaErrorInvalidValue);
  // Copies whose device end is not device memory are refused.
  BOOST_TEST(cudaMemcpy(host.data(), host.data() + 1, 4, cudaMemcpyDeviceToHost) ==
             cudaErrorInvalidValue);
  BOOST_TEST(cudaMemcpy(out, host.data(), 8, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  cudaFree(out);
}

BOOST_AUTO_TEST_CASE(cublaslt_checks_the_shapes) {
  cublasLtHandle_t h = nullptr;
  BOOST_REQUIRE_EQUAL(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t d = nullptr;
  BOOST_REQUIRE_EQUAL(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                      CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  BOOST_REQUIRE_EQUAL(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t),
                      CUBLAS_STATUS_SUCCESS);
  // W (3 x 2, row-major) is column-major 2 x 3; op_T gives 3 x 2; x is 2 x 1; y = W x is 3 x 1.
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, wrong = nullptr;
  cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 2, 3, 2);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 2, 1, 2);
  cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 3, 1, 3);
  cublasLtMatrixLayoutCreate(&wrong, CUDA_R_32F, 3, 2, 3);  // W as if not transposed
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  BOOST_TEST(cublasLtMatmulAlgoGetHeuristic(h, d, wrong, b, c, c, pref, 1, &res, &found) ==
             CUBLAS_STATUS_INVALID_VALUE);
  BOOST_REQUIRE_EQUAL(cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, c, pref, 1, &res, &found),
                      CUBLAS_STATUS_SUCCESS);
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, x = {10, 1};
  float *dw = nullptr, *dx = nullptr, *dy = nullptr;
  cudaMalloc(&dw, sizeof(float) * 6);
  cudaMalloc(&dx, sizeof(float) * 2);
  cudaMalloc(&dy, sizeof(float) * 3);
  cudaMemcpy(dw, w.data(), sizeof(float) * 6, cudaMemcpyHostToDevice);
  cudaMemcpy(dx, x.data(), sizeof(float) * 2, cudaMemcpyHostToDevice);
  const float alpha = 1.0f, beta = 0.0f;  // beta 0: y's NaN poison is never read
  BOOST_REQUIRE_EQUAL(cublasLtMatmul(h, d, &alpha, dw, a, dx, b, &beta, dy, c, dy, c, &res.algo,
                                     nullptr, 0, nullptr),
                      CUBLAS_STATUS_SUCCESS);
  const std::vector<float> y = download(dy, 3);
  BOOST_TEST(y[0] == 12.0f);
  BOOST_TEST(y[1] == 34.0f);
  BOOST_TEST(y[2] == 56.0f);
  for (auto* l : {a, b, c, wrong}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(d);
  cublasLtDestroy(h);
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dy);
}

BOOST_AUTO_TEST_CASE(host_code_touching_device_memory_dies_with_a_message) {
  int* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(int) * 4), cudaSuccess);
  const Death d = run_child([&] {
    volatile int* p = out;
    p[0] = 1;
  });
  BOOST_TEST(d.signalled);
  BOOST_TEST(d.err.find("device memory, from host code") != std::string::npos, d.err);
  cudaFree(out);
}

BOOST_AUTO_TEST_CASE(a_kernel_reading_past_its_allocation_dies_with_a_message) {
  float* in = nullptr;
  float* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&in, sizeof(float) * 16), cudaSuccess);  // the kernel reads 32
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(float)), cudaSuccess);
  const Death d = run_child([&] {
    warp_sums(in, out, 32, nullptr);
    cudaDeviceSynchronize();
  });
  BOOST_TEST(d.signalled);
  BOOST_TEST(d.err.find("warp_sum_kernel") != std::string::npos, d.err);
  BOOST_TEST(d.err.find("past the ends of a device allocation") != std::string::npos, d.err);
  cudaFree(in);
  cudaFree(out);
}

BOOST_AUTO_TEST_CASE(a_divergent_barrier_is_reported_as_a_deadlock) {
  int* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(int) * 32), cudaSuccess);
  const Death d = run_child([&] {
    divergent_barrier(out, nullptr);
    cudaDeviceSynchronize();
  });
  BOOST_TEST(d.signalled);
  BOOST_TEST(d.err.find("deadlock") != std::string::npos, d.err);
  cudaFree(out);
}

BOOST_AUTO_TEST_CASE(a_misaligned_wmma_tile_is_refused) {
  char* tile = nullptr;
  float* out = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMalloc(&tile, 1024), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaMalloc(&out, sizeof(float) * 32), cudaSuccess);
  const Death d = run_child([&] {
    misaligned_wmma(tile + 16, out, nullptr);
    cudaDeviceSynchronize();
  });
  BOOST_TEST(d.signalled);
  BOOST_TEST(d.err.find("32-byte alignment") != std::string::npos, d.err);
  const Death ok = run_child([&] {
    misaligned_wmma(tile, out, nullptr);
    cudaDeviceSynchronize();
  });
  BOOST_TEST(!ok.signalled, ok.err);
  cudaFree(tile);
  cudaFree(out);
}

}  // namespace

BOOST_AUTO_TEST_SUITE_END()  // test_emu_runtime
