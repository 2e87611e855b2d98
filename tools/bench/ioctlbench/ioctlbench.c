// SPDX-License-Identifier: GPL-2.0
/*
 * ioctlbench: time RM ioctls on /dev/nvidiactl, to compare a driver with and without qgpu's
 * hooks. Prints one JSON object: nanoseconds per call for
 *   control   RM_CONTROL on the client (a command the driver does not support: no work in RM)
 *   alloc_free RM_ALLOC + RM_FREE of a system memory object (the tracker's path); null, with
 *             RM's status, where RM refuses the object (the real driver answered an error to
 *             this bare NV_MEMORY_ALLOCATION_PARAMS on 580.159.04)
 *   client_alloc_free RM_ALLOC + RM_FREE of a client (tracked too; accepted by any driver)
 *   sysparams SYS_PARAMS (an escape qgpu passes straight through), with the errno it answers
 * Usage: ioctlbench [ITERATIONS]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "../../../kmod/uapi/nvrm.h"

static int ctl;

static void die(const char *what)
{
	fprintf(stderr, "ioctlbench: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int rm(unsigned int nr, void *arg, size_t size)
{
	return ioctl(ctl, _IOC(_IOC_READ | _IOC_WRITE, NVRM_IOCTL_MAGIC, nr, size), arg);
}

/*
 * Objects are named here, as libcuda names them (qgpu refuses configured cgroups an object left
 * for RM to name); a client's handle is RM's choice.
 */
static uint32_t next_handle = 0x5C200000u;

/* The new object's handle, or 0 with *status RM's answer (-1: the ioctl itself failed). */
static uint32_t try_alloc(uint32_t root, uint32_t parent, uint32_t cls, void *params,
			  long *status)
{
	struct nvos64_params p = {
		.hRoot = root, .hObjectParent = parent, .hClass = cls,
		.hObjectNew = cls == NV01_ROOT_CLIENT ? 0 : ++next_handle,
		.pAllocParms = (uintptr_t)params,
	};

	if (rm(NV_ESC_RM_ALLOC, &p, sizeof(p))) {
		*status = -1;
		return 0;
	}
	*status = p.status;
	return p.status == NV_OK ? p.hObjectNew : 0;
}

static uint32_t alloc(uint32_t root, uint32_t parent, uint32_t cls, void *params)
{
	long status;
	uint32_t h = try_alloc(root, parent, cls, params, &status);

	if (!h) {
		errno = status > 0 ? EIO : errno;
		die("RM_ALLOC");
	}
	return h;
}

static uint32_t rm_free(uint32_t root, uint32_t handle)
{
	struct nvos00_params p = { .hRoot = root, .hObjectParent = root, .hObjectOld = handle };

	if (rm(NV_ESC_RM_FREE, &p, sizeof(p)))
		die("RM_FREE");
	return p.status;
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	struct nv0080_alloc_params device = { 0 };
	struct nv2080_alloc_params subdevice = { 0 };
	struct nv_memory_alloc_params mem = { .size = 4096 };
	struct nvrm_sys_params sys;
	uint32_t client, hdevice, h;
	long status;
	int gpu, sys_errno;
	double t;
	long i;

	ctl = open("/dev/nvidiactl", O_RDWR | O_CLOEXEC);
	gpu = open("/dev/nvidia0", O_RDWR | O_CLOEXEC);
	if (ctl < 0 || gpu < 0)
		die("open");
	if (ioctl(gpu, _IOC(_IOC_READ | _IOC_WRITE, NVRM_IOCTL_MAGIC, NV_ESC_REGISTER_FD,
			    sizeof(int)), &ctl))
		die("REGISTER_FD");
	client = alloc(0, 0, NV01_ROOT_CLIENT, NULL);
	hdevice = alloc(client, client, NV01_DEVICE_0, &device);
	alloc(client, hdevice, NV20_SUBDEVICE_0, &subdevice);
	mem.owner = client;	/* as libcuda: RM refuses an owner of 0 (stdmemValidateParams) */
	/* and system memory whose location is VIDMEM, attr's default (sysmemConstruct) */
	mem.attr = NVOS32_ATTR_LOCATION_PCI << NVOS32_ATTR_LOCATION_SHIFT;

	printf("{\"iterations\": %ld", n);
	t = now_ns();
	for (i = 0; i < n; i++) {
		uint8_t params[8];
		struct nvos54_params p = {
			.hClient = client, .hObject = client, .cmd = 0x00000101u,
			.params = (uintptr_t)params, .paramsSize = sizeof(params),
		};

		if (rm(NV_ESC_RM_CONTROL, &p, sizeof(p)))
			die("RM_CONTROL");
	}
	printf(", \"control_ns\": %.1f", (now_ns() - t) / n);

	h = try_alloc(client, hdevice, NV01_MEMORY_SYSTEM, &mem, &status);
	if (h && rm_free(client, h) == NV_OK) {
		t = now_ns();
		for (i = 0; i < n; i++) {
			h = alloc(client, hdevice, NV01_MEMORY_SYSTEM, &mem);
			if (rm_free(client, h) != NV_OK)
				die("RM_FREE status");
		}
		printf(", \"alloc_free_ns\": %.1f", (now_ns() - t) / n);
	} else {
		printf(", \"alloc_free_ns\": null, \"alloc_free_status\": %ld", status);
	}

	t = now_ns();
	for (i = 0; i < n; i++) {
		h = alloc(0, 0, NV01_ROOT_CLIENT, NULL);
		if (rm_free(h, h) != NV_OK)
			die("RM_FREE status");
	}
	printf(", \"client_alloc_free_ns\": %.1f", (now_ns() - t) / n);

	/*
	 * The real driver answers EBUSY once the block size is set (580.159.04, call BC): the
	 * call is timed all the same (it passes the hooks and the driver either way), and the
	 * answer reported.
	 */
	sys_errno = rm(NV_ESC_SYS_PARAMS, &sys, sizeof(sys)) ? errno : 0;
	t = now_ns();
	for (i = 0; i < n; i++)
		if (rm(NV_ESC_SYS_PARAMS, &sys, sizeof(sys)) && errno != sys_errno)
			die("SYS_PARAMS");
	printf(", \"sysparams_ns\": %.1f, \"sysparams_errno\": %d}\n", (now_ns() - t) / n,
	       sys_errno);
	rm_free(client, client);
	return 0;
}
