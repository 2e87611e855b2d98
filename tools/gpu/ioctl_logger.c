// SPDX-License-Identifier: GPL-2.0
/*
 * ioctl_logger: an LD_PRELOAD counter of a process's NVIDIA driver calls, independent of the
 * eBPF probe it checks. It keeps its own fd table from libc's open/openat/close, counts every
 * ioctl on an NVIDIA device file by (node, escape) and records the class and status of each
 * RM_ALLOC after the call. At exit it writes JSON to $IOCTL_LOGGER_OUT.
 *
 * Nothing here comes from qpolicy: the point is a second opinion.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define MAX_FDS 65536
#define NODE_NONE 0
#define NODE_CTL 1
#define NODE_GPU 2
#define NODE_UVM 3
#define MAX_ALLOCS 65536

static unsigned char fd_node[MAX_FDS];
static unsigned long counts[4][256];	/* NV nodes: by escape NR */
static unsigned long uvm_counts[4096];	/* uvm: by request number (small ones) */
static struct { unsigned long request, count; } uvm_large[16];	/* UVM_INITIALIZE and kin */
static unsigned long uvm_other;
static struct { uint32_t cls, status; int ret; } allocs[MAX_ALLOCS];
static unsigned long nallocs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real_close)(int);
static int (*real_ioctl)(int, unsigned long, ...);

static int node_of(const char *path)
{
	const char *name = strrchr(path, '/');

	name = name ? name + 1 : path;
	if (strcmp(name, "nvidiactl") == 0)
		return NODE_CTL;
	if (strncmp(name, "nvidia-uvm", 10) == 0)
		return NODE_UVM;
	if (strncmp(name, "nvidia", 6) == 0 && name[6] >= '0' && name[6] <= '9')
		return NODE_GPU;
	return NODE_NONE;
}

static void remember(int fd, const char *path)
{
	if (fd >= 0 && fd < MAX_FDS)
		fd_node[fd] = path ? node_of(path) : NODE_NONE;
}

#define OPEN_WRAPPER(fn, real)                                                 \
	int fn(const char *path, int flags, ...)                               \
	{                                                                      \
		mode_t mode = 0;                                               \
		int fd;                                                        \
		if (flags & (O_CREAT | O_TMPFILE)) {                           \
			va_list ap;                                            \
			va_start(ap, flags);                                   \
			mode = va_arg(ap, mode_t);                             \
			va_end(ap);                                            \
		}                                                              \
		if (!real)                                                     \
			real = dlsym(RTLD_NEXT, #fn);                          \
		fd = real(path, flags, mode);                                  \
		remember(fd, path);                                            \
		return fd;                                                     \
	}

OPEN_WRAPPER(open, real_open)
OPEN_WRAPPER(open64, real_open64)

#define OPENAT_WRAPPER(fn, real)                                               \
	int fn(int dirfd, const char *path, int flags, ...)                    \
	{                                                                      \
		mode_t mode = 0;                                               \
		int fd;                                                        \
		if (flags & (O_CREAT | O_TMPFILE)) {                           \
			va_list ap;                                            \
			va_start(ap, flags);                                   \
			mode = va_arg(ap, mode_t);                             \
			va_end(ap);                                            \
		}                                                              \
		if (!real)                                                     \
			real = dlsym(RTLD_NEXT, #fn);                          \
		fd = real(dirfd, path, flags, mode);                           \
		remember(fd, path);                                            \
		return fd;                                                     \
	}

OPENAT_WRAPPER(openat, real_openat)
OPENAT_WRAPPER(openat64, real_openat64)

int close(int fd)
{
	if (!real_close)
		real_close = dlsym(RTLD_NEXT, "close");
	if (fd >= 0 && fd < MAX_FDS)
		fd_node[fd] = NODE_NONE;
	return real_close(fd);
}

int ioctl(int fd, unsigned long request, ...)
{
	va_list ap;
	void *arg;
	int ret, node;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real_ioctl)
		real_ioctl = dlsym(RTLD_NEXT, "ioctl");
	ret = real_ioctl(fd, request, arg);
	node = (fd >= 0 && fd < MAX_FDS) ? fd_node[fd] : NODE_NONE;
	if (node == NODE_NONE)
		return ret;
	pthread_mutex_lock(&lock);
	if (node == NODE_UVM) {
		if (request < 4096) {
			uvm_counts[request]++;
		} else {
			int i;

			for (i = 0; i < 16; i++)
				if (uvm_large[i].request == request || !uvm_large[i].count)
					break;
			if (i < 16) {
				uvm_large[i].request = request;
				uvm_large[i].count++;
			} else {
				uvm_other++;
			}
		}
	} else if (((request >> 8) & 0xff) == 'F') {
		unsigned int nr = request & 0xff, size = (request >> 16) & 0x3fff;

		counts[node][nr]++;
		/* RM_ALLOC: hClass at 12; status at 28 (NVOS21, 32 bytes) or 40 (NVOS64, 48). */
		if (nr == 0x2b && (size == 32 || size == 48) && arg && nallocs < MAX_ALLOCS) {
			const unsigned char *p = arg;

			memcpy(&allocs[nallocs].cls, p + 12, 4);
			memcpy(&allocs[nallocs].status, p + (size == 48 ? 40 : 28), 4);
			allocs[nallocs].ret = ret;
			nallocs++;
		}
	}
	pthread_mutex_unlock(&lock);
	return ret;
}

__attribute__((destructor)) static void dump(void)
{
	const char *out = getenv("IOCTL_LOGGER_OUT");
	static const char *names[] = { "none", "ctl", "gpu", "uvm" };
	FILE *f;
	int node, nr, first = 1;
	unsigned long i;

	if (!out || !(f = fopen(out, "w")))
		return;
	fprintf(f, "{\"escapes\": {");
	for (node = NODE_CTL; node <= NODE_GPU; node++)
		for (nr = 0; nr < 256; nr++)
			if (counts[node][nr]) {
				fprintf(f, "%s\"%s:%d\": %lu", first ? "" : ", ", names[node], nr,
					counts[node][nr]);
				first = 0;
			}
	fprintf(f, "}, \"uvm\": {");
	first = 1;
	for (nr = 0; nr < 4096; nr++)
		if (uvm_counts[nr]) {
			fprintf(f, "%s\"%d\": %lu", first ? "" : ", ", nr, uvm_counts[nr]);
			first = 0;
		}
	for (nr = 0; nr < 16 && uvm_large[nr].count; nr++) {
		fprintf(f, "%s\"%lu\": %lu", first ? "" : ", ", uvm_large[nr].request,
			uvm_large[nr].count);
		first = 0;
	}
	fprintf(f, "}, \"uvm_other\": %lu, \"allocs\": [", uvm_other);
	for (i = 0; i < nallocs; i++)
		fprintf(f, "%s[%u, %u, %d]", i ? ", " : "", allocs[i].cls, allocs[i].status,
			allocs[i].ret);
	fprintf(f, "]}\n");
	fclose(f);
}
