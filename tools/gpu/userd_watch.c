// SPDX-License-Identifier: GPL-2.0
/*
 * userd_watch: an LD_PRELOAD library that watches, from inside a CUDA process, when the GPU
 * moves GP_GET in the USERD of each of the process's channels, against when the process moved
 * GP_PUT. tools/gpu/userd_fetch.py runs a PyTorch process under it and sets the two side by side
 * with the process's own timings of each kernel.
 *
 * libcuda gives each channel a 512-byte USERD slot in video memory of its own (hUserdMemory[0],
 * userdOffset[0] of the channel's RM_ALLOC) and maps that memory through BAR1 with RM_MAP_MEMORY
 * onto a fresh device fd, then mmap()s that fd (tools/gpuload/CUDA_SEQUENCE.md). This library
 * notes the channel allocations, each RM_MAP_MEMORY by its target fd and the mmap() that follows
 * on it, and from those finds each slot's address in the process. A thread then reads, as fast
 * as it can, three 64-bit words of every slot: GP_GET and GP_PUT (0x88), the pushbuffer's Put
 * and Get (0x40) and TopLevelGet with its high half (0x58), as clc86f.h lays out Nvc86fControl,
 * and keeps each change with its CLOCK_MONOTONIC time. At exit it writes JSON to
 * $USERD_WATCH_OUT.
 *
 * It only reads: nothing here writes USERD or calls the driver on its own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>

#define NV_IOCTL_MAGIC		'F'
#define NV_ESC_RM_ALLOC		0x2B
#define NV_ESC_RM_MAP_MEMORY	0x4E
#define USERD_GP_GET		0x88	/* clc86f.h Nvc86fControl.GPGet; GPPut follows at 0x8C */
#define USERD_PUT		0x40	/* Nvc86fControl.Put; Get (read only) follows at 0x44 */
#define USERD_TOP_LEVEL_GET	0x58	/* Nvc86fControl.TopLevelGet; TopLevelGetHi at 0x5C */

#define MAX_FDS		4096
#define MAX_CHANNELS	256
#define MAX_MAPS	1024
#define MAX_EVENTS	(1 << 20)

struct nvos64 {		/* RM_ALLOC (nvos.h NVOS64_PARAMETERS, 48 bytes) */
	uint32_t hRoot, hObjectParent, hObjectNew, hClass;
	uint64_t pAllocParms, pRightsRequested;
	uint32_t paramsSize, flags, status, pad;
};

struct nvos33_fd {	/* RM_MAP_MEMORY (nv-unix-nvos-params-wrappers.h, 56 bytes) */
	uint32_t hClient, hDevice, hMemory, pad;
	uint64_t offset, length, pLinearAddress;
	uint32_t status, flags;
	int32_t fd;
	uint32_t pad2;
};

struct channel {
	uint32_t client, handle, cls, userd_mem;
	uint64_t userd_off;
	volatile char *userd;		/* the slot, once found */
	uint64_t last[3];
};

struct map {
	uint32_t client, memory;
	uint64_t offset, length;
	char *base;
};

struct event {
	uint64_t t_ns;
	uint32_t channel, get, put, pb_put, pb_get;
	uint64_t top_get;
};

static struct { uint32_t client, memory; uint64_t offset, length; int pending; } by_fd[MAX_FDS];
static struct channel channels[MAX_CHANNELS];
static struct map maps[MAX_MAPS];
static struct event *events;
static atomic_int nchannels;
static int nmaps;
static atomic_ulong nevents, nreads;
static atomic_int stop;
static pthread_t watcher;
static int started;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t t_start;

static int (*real_ioctl)(int, unsigned long, ...);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off64_t);

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* A channel's USERD, once a mapping of its memory covering the slot is known. Lock held. */
static void resolve(struct channel *ch)
{
	int i;

	for (i = 0; i < nmaps && !ch->userd; i++) {
		struct map *m = &maps[i];

		if (m->client == ch->client && m->memory == ch->userd_mem &&
		    ch->userd_off >= m->offset && ch->userd_off + 0x200 <= m->offset + m->length)
			__atomic_store_n(&ch->userd,
					 (volatile char *)(m->base + (ch->userd_off - m->offset)),
					 __ATOMIC_RELEASE);
	}
}

static void *watch(void *unused)
{
	int i, n;

	(void)unused;
	while (!atomic_load(&stop)) {
		n = atomic_load(&nchannels);
		for (i = 0; i < n; i++) {
			struct channel *ch = &channels[i];
			volatile char *userd = __atomic_load_n(&ch->userd, __ATOMIC_ACQUIRE);
			uint64_t gp, pb, top, k;

			if (!userd)
				continue;
			gp = *(volatile uint64_t *)(userd + USERD_GP_GET);
			pb = *(volatile uint64_t *)(userd + USERD_PUT);
			top = *(volatile uint64_t *)(userd + USERD_TOP_LEVEL_GET);
			atomic_fetch_add(&nreads, 1);
			if (gp == ch->last[0] && pb == ch->last[1] && top == ch->last[2])
				continue;
			ch->last[0] = gp;
			ch->last[1] = pb;
			ch->last[2] = top;
			k = atomic_fetch_add(&nevents, 1);
			if (k < MAX_EVENTS)
				events[k] = (struct event){ now_ns(), i, (uint32_t)gp,
							    (uint32_t)(gp >> 32), (uint32_t)pb,
							    (uint32_t)(pb >> 32), top };
		}
	}
	return NULL;
}

static void start_watcher(void)
{
	if (started)
		return;
	events = calloc(MAX_EVENTS, sizeof(*events));
	if (events && !pthread_create(&watcher, NULL, watch, NULL))
		started = 1;
}

/* Channel classes end in 0x6f (GPFIFO); their parameters hold the client's USERD. */
static void note_alloc(const struct nvos64 *p)
{
	const uint8_t *params = (const uint8_t *)(uintptr_t)p->pAllocParms;
	struct channel *ch;
	int n;

	if (p->status || (p->hClass & 0xff) != 0x6f || !params)
		return;
	n = atomic_load(&nchannels);
	if (n >= MAX_CHANNELS)
		return;
	ch = &channels[n];
	ch->client = p->hRoot;
	ch->handle = p->hObjectNew;
	ch->cls = p->hClass;
	memcpy(&ch->userd_mem, params + 32, sizeof(ch->userd_mem));	/* hUserdMemory[0] */
	memcpy(&ch->userd_off, params + 64, sizeof(ch->userd_off));	/* userdOffset[0] */
	memset(ch->last, 0xff, sizeof(ch->last));
	resolve(ch);
	atomic_store(&nchannels, n + 1);
	start_watcher();
}

int ioctl(int fd, unsigned long request, ...)
{
	unsigned int nr = request & 0xff, type = (request >> 8) & 0xff;
	unsigned int size = (request >> 16) & 0x3fff;
	va_list ap;
	void *arg;
	int ret;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real_ioctl)
		real_ioctl = dlsym(RTLD_NEXT, "ioctl");
	ret = real_ioctl(fd, request, arg);
	if (ret || type != NV_IOCTL_MAGIC || !arg)
		return ret;
	pthread_mutex_lock(&lock);
	if (nr == NV_ESC_RM_ALLOC && size == sizeof(struct nvos64)) {
		note_alloc(arg);
	} else if (nr == NV_ESC_RM_MAP_MEMORY && size == sizeof(struct nvos33_fd)) {
		const struct nvos33_fd *m = arg;

		if (!m->status && m->fd >= 0 && m->fd < MAX_FDS) {
			by_fd[m->fd].client = m->hClient;
			by_fd[m->fd].memory = m->hMemory;
			by_fd[m->fd].offset = m->offset;
			by_fd[m->fd].length = m->length;
			by_fd[m->fd].pending = 1;
		}
	}
	pthread_mutex_unlock(&lock);
	return ret;
}

static void note_mmap(void *base, int fd)
{
	int i, n;

	if (base == MAP_FAILED || fd < 0 || fd >= MAX_FDS)
		return;
	pthread_mutex_lock(&lock);
	if (by_fd[fd].pending && nmaps < MAX_MAPS) {
		maps[nmaps++] = (struct map){ by_fd[fd].client, by_fd[fd].memory,
					      by_fd[fd].offset, by_fd[fd].length, base };
		by_fd[fd].pending = 0;
		n = atomic_load(&nchannels);
		for (i = 0; i < n; i++)
			if (!channels[i].userd)
				resolve(&channels[i]);
	}
	pthread_mutex_unlock(&lock);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	void *ret;

	if (!real_mmap)
		real_mmap = dlsym(RTLD_NEXT, "mmap");
	ret = real_mmap(addr, len, prot, flags, fd, off);
	note_mmap(ret, fd);
	return ret;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off)
{
	void *ret;

	if (!real_mmap64)
		real_mmap64 = dlsym(RTLD_NEXT, "mmap64");
	ret = real_mmap64(addr, len, prot, flags, fd, off);
	note_mmap(ret, fd);
	return ret;
}

__attribute__((constructor)) static void begin(void)
{
	t_start = now_ns();
}

/*
 * Stop watching and write the report: called by the process (ctypes) before it lets CUDA go,
 * whose teardown unmaps USERD under the watcher; the destructor is the fallback.
 */
void userd_watch_stop(void)
{
	const char *path = getenv("USERD_WATCH_OUT");
	static int reported;
	unsigned long k, n;
	FILE *out;
	int i;

	if (reported++)
		return;
	atomic_store(&stop, 1);
	if (started)
		pthread_join(watcher, NULL);
	if (!path || !(out = fopen(path, "w")))
		return;
	n = atomic_load(&nevents);
	fprintf(out, "{\"start_ns\": %llu, \"reads\": %lu, \"events_lost\": %lu, \"channels\": [",
		(unsigned long long)t_start, atomic_load(&nreads),
		n > MAX_EVENTS ? n - MAX_EVENTS : 0);
	for (i = 0; i < atomic_load(&nchannels); i++)
		fprintf(out, "%s{\"client\": %u, \"handle\": %u, \"class\": %u, \"userd_mem\": %u, "
			"\"userd_off\": %llu, \"mapped\": %s}", i ? ", " : "", channels[i].client,
			channels[i].handle, channels[i].cls, channels[i].userd_mem,
			(unsigned long long)channels[i].userd_off,
			channels[i].userd ? "true" : "false");
	fprintf(out, "], \"events\": [");
	for (k = 0; k < n && k < MAX_EVENTS; k++)
		fprintf(out, "%s[%llu, %u, %u, %u, %u, %u, %llu]", k ? ", " : "",
			(unsigned long long)events[k].t_ns, events[k].channel, events[k].get,
			events[k].put, events[k].pb_put, events[k].pb_get,
			(unsigned long long)events[k].top_get);
	fprintf(out, "]}\n");
	fclose(out);
}

__attribute__((destructor)) static void report(void)
{
	userd_watch_stop();
}
