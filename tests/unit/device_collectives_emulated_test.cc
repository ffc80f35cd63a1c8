// device_collectives_emulated_test.cc: the device collectives of libchorus's device engine
// (src/core/device.cc, its kernels and CUDA IPC, compiled for the host against
// tests/support/cuda_emulation.h: chorus_emulated), by tests/gpu/device_collectives_test.cc's own
// tests: every path (direct, ipc, staged and their variants) between forked ranks sharing the
// emulated device, every type and op, every collective, stream order, graph capture and replay,
// and how a call ends when its peer never comes, dies, or the communicator is aborted.
// It checks the engine's logic (what each rank publishes, maps, copies and reduces, how the
// streams of the ranks are ordered by events, the staging areas, the proxy) with streams that run
// as host threads; the GPU test checks the hardware's memory ordering, which the emulation does
// not model.
//
// The same tests under a name of their own (ctest lists the GPU test's too).
#define DeviceCollectivesTest EmulatedDeviceCollectivesTest
#define DeviceFailureTest EmulatedDeviceFailureTest
#define DirectFailureTest EmulatedDirectFailureTest
#include "tests/gpu/device_collectives_test.cc"
