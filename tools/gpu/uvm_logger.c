// SPDX-License-Identifier: GPL-2.0
/*
 * uvm_logger: an LD_PRELOAD logger of what a process sends to /dev/nvidia-uvm through libc:
 * every ioctl (command, return; base and length of ALLOC_SEMAPHORE_POOL 68 and ALLOC_DEVICE_P2P
 * 78) and every mmap of the UVM file, one "UVMLOG" line each on stderr. Used by
 * tools/gpu/uvm_managed.py to see what CUDA's start-up and cuMemAllocManaged ask of nvidia-uvm.
 *
 * With UVM_LOGGER_REFUSE_MANAGED=N (an errno; 1, EPERM, is what qgpu.ko answers) it also
 * answers as qgpu.ko does for a memory-limited cgroup (kmod/qgpu/uvm.c): an mmap of the UVM file
 * that is not of a range an ALLOC_SEMAPHORE_POOL or ALLOC_DEVICE_P2P made fails with errno N,
 * after the range is unmapped, as the kernel has unmapped a MAP_FIXED range before the driver's
 * mmap fails. So what CUDA then does can be seen
 * on a GPU host, where qgpu.ko itself cannot load.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <stdint.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

/* Ranges made by ioctl: a mapping of one of them is not managed memory. */
static struct { uint64_t base, length; } made[64];
static int nmade;

static int is_uvm(int fd)
{
	char p[64], t[128];
	ssize_t n;
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	n = readlink(p, t, sizeof(t) - 1);
	if (n < 0)
		return 0;
	t[n] = 0;
	return strcmp(t, "/dev/nvidia-uvm") == 0;
}

int ioctl(int fd, unsigned long req, ...)
{
	static int (*real)(int, unsigned long, void *);
	va_list ap;
	void *arg;
	int r;
	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real)
		real = dlsym(RTLD_NEXT, "ioctl");
	r = real(fd, req, arg);
	if (is_uvm(fd)) {
		uint64_t *q = arg;
		fprintf(stderr, "UVMLOG ioctl cmd=%lu ret=%d", req, r);
		if (q && (req == 68 || req == 78)) {
			fprintf(stderr, " base=0x%lx length=%lu", (unsigned long)q[0], (unsigned long)q[1]);
			if (r == 0 && nmade < 64) {
				made[nmade].base = q[0];
				made[nmade].length = q[1];
				nmade++;
			}
		}
		fprintf(stderr, "\n");
	}
	return r;
}

static int refused(void *addr, size_t len, int fd)
{
	const char *env = getenv("UVM_LOGGER_REFUSE_MANAGED");
	int i;

	if (!env || atoi(env) <= 0 || fd < 0 || !is_uvm(fd))
		return 0;
	for (i = 0; i < nmade; i++)
		if (made[i].base == (uint64_t)(uintptr_t)addr && made[i].length == len)
			return 0;
	munmap(addr, len);
	fprintf(stderr, "UVMLOG refused addr=%p len=%zu\n", addr, len);
	errno = atoi(env);
	return 1;
}

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

/* mmap and mmap64 alike: refused as qgpu would, else the real call, logged on the UVM file. */
static void *mapped(const char *name, mmap_fn *real, void *addr, size_t len, int prot, int flags,
		    int fd, off_t off)
{
	void *r;

	if (!*real)
		*real = (mmap_fn)dlsym(RTLD_NEXT, name);
	if (refused(addr, len, fd))
		return MAP_FAILED;
	r = (*real)(addr, len, prot, flags, fd, off);
	if (fd >= 0 && is_uvm(fd))
		fprintf(stderr, "UVMLOG %s addr=%p len=%zu prot=%d flags=0x%x off=0x%lx ret=%p\n",
			name, addr, len, prot, flags, (unsigned long)off, r);
	return r;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	static mmap_fn real;

	return mapped("mmap", &real, addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	static mmap_fn real;

	return mapped("mmap64", &real, addr, len, prot, flags, fd, off);
}
