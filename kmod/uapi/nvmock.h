/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * What nvmock.ko adds to the RM ABI of kmod/uapi/nvrm.h: the method set its simulated engine runs,
 * and where in a GPU's address space its memory objects live.
 *
 * A workload submits as on Volta+: it writes GPFIFO entries into a memory object it mapped, each
 * entry pointing at a pushbuffer segment (GPU address and length in 32-bit words); it advances
 * GP_PUT in the channel's USERD and writes the work-submit token to the usermode doorbell. The
 * engine notices GP_PUT moving, whatever the doorbell says. A pushbuffer segment is a sequence of
 * (method, data) word pairs.
 */
#ifndef _UAPI_QPOLICY_NVMOCK_H
#define _UAPI_QPOLICY_NVMOCK_H

#include <linux/types.h>

/* Keep the engine busy for data microseconds of this channel's TSG time. */
#define NVMOCK_METHOD_RUN_US		0x0001
/* The GPU address a later SEM_RELEASE writes to (low and high 32 bits). */
#define NVMOCK_METHOD_SEM_ADDR_LO	0x0002
#define NVMOCK_METHOD_SEM_ADDR_HI	0x0003
/* Write data, 32 bits, at the semaphore address, once everything before it has run. */
#define NVMOCK_METHOD_SEM_RELEASE	0x0004

/*
 * Memory objects (NV01_MEMORY_SYSTEM, NV01_MEMORY_LOCAL_USER) get a GPU address when allocated,
 * returned in NV_MEMORY_ALLOCATION_PARAMS.offset: the lowest free range, 64 KiB aligned, in
 * [NVMOCK_GPU_VA_BASE, NVMOCK_GPU_VA_END). Ranges never overlap; freed ones are reused.
 */
#define NVMOCK_GPU_VA_BASE		0x100000000ull
#define NVMOCK_GPU_VA_END		0x10000000000ull
/* System memory objects up to this size have backing pages the engine reads and writes. */
#define NVMOCK_MAX_BACKED_BYTES		(64u << 20)

/* The version string CHECK_VERSION_STR answers with (the H200 host's driver). */
#define NVMOCK_VERSION_STRING		"580.159.04"

#endif /* _UAPI_QPOLICY_NVMOCK_H */
