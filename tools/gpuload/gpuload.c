// SPDX-License-Identifier: GPL-2.0
/*
 * gpuload: a load generator that drives an NVIDIA RM driver (nvmock.ko in tests) the way a CUDA
 * process on an H200 does. Setting up is a sequence of ioctls on /dev/nvidiactl and /dev/nvidiaN
 * that builds a client, device, TSG and Hopper channel; after that, work is submitted with no
 * system call at all: a GPFIFO entry in mapped system memory, GP_PUT in the channel's USERD and
 * the work-submit token on the usermode doorbell. Completion is a semaphore the engine writes.
 *
 * Every ioctl issued is counted per escape, so that a test can hold the numbers against what an
 * eBPF probe saw. On any failure it prints one line on stderr and exits 1, leaving the driver to
 * clean up on close as it must for a crashed process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <linux/ioctl.h>

#include "../../kmod/uapi/nvrm.h"
#include "../../kmod/uapi/nvmock.h"

/* The layouts gpuload sends; a drifted header would otherwise fail only at run time. */
_Static_assert(sizeof(struct nvos00_params) == 16, "NVOS00");
_Static_assert(sizeof(struct nvos64_params) == 48, "NVOS64");
_Static_assert(sizeof(struct nvos54_params) == 32, "NVOS54");
_Static_assert(sizeof(struct nvos33_params_with_fd) == 56, "NVOS33 with fd");
_Static_assert(sizeof(struct nvrm_card_info) == 72, "card info");
_Static_assert(sizeof(struct nvrm_api_version) == 72, "api version");
_Static_assert(sizeof(struct nvrm_sys_params) == 8, "sys params");
_Static_assert(sizeof(struct nvrm_register_fd) == 4, "register fd");
_Static_assert(sizeof(struct nv0080_alloc_params) == 56, "NV0080 alloc");
_Static_assert(sizeof(struct nv2080_alloc_params) == 4, "NV2080 alloc");
_Static_assert(sizeof(struct nv_channel_group_alloc_params) == 20, "TSG alloc");
_Static_assert(sizeof(struct nv_ctxshare_alloc_params) == 12, "ctxshare alloc");
_Static_assert(sizeof(struct nv_channel_alloc_params) == 368, "channel alloc");
_Static_assert(sizeof(struct nv_memory_alloc_params) == 128, "memory alloc");
_Static_assert(sizeof(struct nva06c_gpfifo_schedule_params) == 3, "GPFIFO_SCHEDULE");
_Static_assert(sizeof(struct nvc36f_work_submit_token_params) == 4, "work submit token");
_Static_assert(sizeof(NVMOCK_VERSION_STRING) <= sizeof(((struct nvrm_api_version *)0)->version),
	       "version string");

/* libcuda numbers the objects it names itself from here. */
#define HANDLE_BASE		0x5c000000u
#define CARD_INFO_ENTRIES	32
#define MEMBLOCK_SIZE		(1ull << 30)
#define GPFIFO_ENTRIES		512u
#define USERD_MAP_SIZE		4096
/* --userd=client: libcuda's USERD object (2 MiB of video memory) and first slot (H200 trace). */
#define USERD_MEM_SIZE		(2u << 20)
#define USERD_DEFAULT_OFFSET	0x2000
#define GP_ADDR_LIMIT		(1ull << 40)	/* GET (31:2) and GET_HI (7:0) of an entry */

/*
 * The system memory object: the GPFIFO ring, then the semaphore on a page of its own (so the
 * engine's writes never share a cache line with ours), then the ring of pushbuffer segments.
 */
#define RING_OFFSET		0
#define SEM_OFFSET		4096
#define SEG_OFFSET		8192
#define SEG_ALIGN		64
#define SEG_TAIL_WORDS		6	/* SEM_ADDR_LO, SEM_ADDR_HI and SEM_RELEASE pairs */

/*
 * --tree cuda: the shape of the H200 trace (qpolicy/nvrm/data/h200-pytorch-matmul.jsonl.gz, one
 * PyTorch process on 580.159.04; tools/gpuload/CUDA_SEQUENCE.md walks through it). One compute
 * TSG with a context share and 8 channels, then 3 copy-engine TSGs of 4 channels each; every
 * channel's GPFIFO ring and USERD sit in one 2 MiB video memory object, 0x3000 bytes apart
 * (ring at 0x3000 n, 1024 entries; USERD at 0x3000 n + 0x2000), mapped through the GPU's file;
 * each channel has a 4 KiB error notifier in system memory.
 */
#define CUDA_GR_CHANNELS	8
#define CUDA_CE_TSGS		3
#define CUDA_CE_CHANNELS	4
#define CUDA_CHANNELS		(CUDA_GR_CHANNELS + CUDA_CE_TSGS * CUDA_CE_CHANNELS)
#define CUDA_ENTRIES		1024u
#define CUDA_CHANNEL_STRIDE	0x3000u
#define CUDA_USERD_IN_STRIDE	0x2000u
#define CUDA_USERD_MEM_SIZE	(2u << 20)
#define CUDA_NOTIFIER_SIZE	4096u
#define CUDA_CE_ENGINE_FIRST	(NV2080_ENGINE_TYPE_COPY0 + 2)	/* the trace's TSGs: COPY2..4 */
#define CUDA_GR_COPY_CE		1u	/* the copy object on a compute channel: CE instance 1 */
#define GR_PARAMS_SIZE		16	/* NV_GR_ALLOCATION_PARAMETERS (nvos.h) */
#define CUDA_TIMESLICE_US	2048u	/* the SET_TIMESLICE the trace sends on its compute TSG */
/* NVOS04 flags as the trace sends them: PRIVILEGED_CHANNEL (5:5) on every channel, and
 * GROUP_CHANNEL_RUNQUEUE (4:4) = 1 on every second channel of the compute TSG (alloc_channel.h).
 * Never DELAY_CHANNEL_SCHEDULING: CUDA relies on GPFIFO_SCHEDULE alone. */
#define CUDA_CH_FLAGS		0x20u
#define CUDA_CH_RUNQUEUE1	0x10u
/* NV_MEMORY_ALLOCATION_PARAMS as the trace's USERD memory and notifiers have them. */
#define CUDA_VID_FLAGS		0x1c101u
#define CUDA_VID_ATTR		0x11800000u
#define CUDA_VID_ATTR2		0x100005u
#define CUDA_VID_ALIGN		(2u << 20)
#define CUDA_NOTIFIER_TYPE	0xdu	/* NVOS32_TYPE_NOTIFIER */
#define CUDA_SYS_FLAGS		0xc001u
#define CUDA_SYS_ATTR		0x2a800000u
#define CUDA_SYS_ATTR2		0x9u
/* RM_MAP_MEMORY flags as the trace sends them, per kind of memory. */
#define CUDA_MAP_USERMODE	0x3080002u
#define CUDA_MAP_USERMODE_BAR1	0x0890002u
#define CUDA_MAP_VIDMEM		0x10d0000u
#define CUDA_MAP_SYSMEM		0x30c8000u
#define NV0080_VA_MODE_MULTI	2u	/* the trace's device: vaMode 2 */
#define VASPACE_PARAMS_SIZE	56
#define USERMODE_PARAMS_SIZE	2

#define NSEC_PER_SEC		1000000000ull
#define SLEEP_CHUNK_NS		(100 * 1000 * 1000ull)	/* re-check for signals this often */
#define DRAIN_NS		(2 * NSEC_PER_SEC)

#define MAX_KERNELS_PER_BATCH	100000u
#define MAX_KERNEL_US		60000000u
#define MAX_SYSMEM_MIB		(NVMOCK_MAX_BACKED_BYTES >> 20)
#define MAX_VIDMEM_MIB		(16ul << 20)	/* 16 TiB: far past any GPU, for refusals */

enum shape {
	SHAPE_SATURATE,
	SHAPE_REQUESTS,
};

/* Which object tree setup builds: gpuload's own minimal one, or the one CUDA builds. */
enum tree {
	TREE_SIMPLE,
	TREE_CUDA,
};

struct config {
	const char *dev_dir;
	unsigned int gpu;
	enum shape shape;
	double seconds;
	bool has_start_at;
	double start_at;
	const char *label;
	unsigned int kernel_us;
	unsigned int sync_every;
	unsigned int queue;
	double rate_hz;
	bool poisson;
	unsigned int kernels;
	unsigned int mem_mib;
	unsigned int steps;
	unsigned long vidmem_mib;
	unsigned long vidmem_hold_mib;
	bool no_free;
	bool timeline;
	double timeout;
	unsigned int poll_us;
	bool has_seed;
	unsigned long seed;
	bool userd_client;		/* --userd=client: USERD in our own video memory */
	unsigned long userd_offset;
	enum tree tree;
};

struct mapping {
	int fd;
	void *addr;
	size_t len;
};

/* What the driver gave us, and the handles we named. */
struct gpu {
	const struct config *cfg;
	char ctl_path[PATH_MAX];
	char gpu_path[PATH_MAX];
	int ctl;
	int gpu_fd;
	uint32_t gpu_id;
	uint32_t next_handle;
	uint32_t client;
	uint32_t device;
	uint32_t subdevice;
	uint32_t usermode;
	uint32_t vaspace;
	uint32_t sysmem;
	uint64_t sysmem_va;
	uint64_t sysmem_size;
	uint32_t tsg;
	uint32_t ctxshare;
	uint32_t channel;
	uint32_t userd_mem;	/* --userd=client, --tree cuda: the memory USERD is in */
	uint32_t compute;
	uint32_t copy;
	uint32_t token;
	struct mapping usermode_map;
	struct mapping sysmem_map;
	struct mapping userd_map;
	/* --tree cuda: the objects CUDA adds (see setup_cuda) */
	uint32_t usermode2;
	uint32_t vaspace2;
	uint64_t userd_va;
	struct mapping usermode2_map;
	struct mapping notifier_maps[CUDA_CHANNELS];
	unsigned int nnotifiers;
	uint32_t userd_offset;	/* of the channel work is submitted on, in userd_map */
	uint32_t ring_offset;	/* of its GPFIFO ring, in userd_map (sysmem_map for TREE_SIMPLE) */
	uint32_t entries;	/* of that ring */
	bool hold_tried;
	uint32_t hold_status;
};

/* The submission side of one channel. Batches are numbered from 1; the semaphore holds the low
 * 32 bits of the last one done. */
struct submitter {
	uint32_t *ring;
	volatile uint32_t *sem;
	uint8_t *segs;
	uint64_t segs_va;
	uint64_t sem_va;
	size_t seg_stride;
	unsigned int nseg;
	uint64_t *submit_ns;	/* per segment slot */
	volatile uint32_t *gp_get;
	volatile uint32_t *gp_put;
	volatile uint32_t *doorbell;
	uint32_t token;
	uint32_t entries;
	uint32_t put;
	uint64_t submitted;
	uint64_t completed;
	unsigned int kernels;	/* per batch */
	uint32_t kernel_us;
};

struct results {
	uint64_t t0;
	uint64_t end;
	double *lat_ms;
	double *done_s;
	size_t n;
	size_t cap;
	uint64_t kernels;
	bool interrupted;
	uint64_t inflight_at_exit;
};

static unsigned long ioctl_counts[256];
static volatile sig_atomic_t stop_count;

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void usage_error(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("gpuload: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("gpuload: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

#define STATUS(x) { x, #x }
static const struct {
	uint32_t code;
	const char *name;
} status_names[] = {
	STATUS(NV_OK),
	STATUS(NV_ERR_INSUFFICIENT_RESOURCES),
	STATUS(NV_ERR_INSUFFICIENT_PERMISSIONS),
	STATUS(NV_ERR_INVALID_ARGUMENT),
	STATUS(NV_ERR_INVALID_CLASS),
	STATUS(NV_ERR_INVALID_CLIENT),
	STATUS(NV_ERR_INVALID_COMMAND),
	STATUS(NV_ERR_INVALID_DEVICE),
	STATUS(NV_ERR_INVALID_OBJECT),
	STATUS(NV_ERR_INVALID_OBJECT_HANDLE),
	STATUS(NV_ERR_INVALID_OBJECT_NEW),
	STATUS(NV_ERR_INVALID_OBJECT_OLD),
	STATUS(NV_ERR_INVALID_OBJECT_PARENT),
	STATUS(NV_ERR_INVALID_PARAM_STRUCT),
	STATUS(NV_ERR_INVALID_POINTER),
	STATUS(NV_ERR_INVALID_STATE),
	STATUS(NV_ERR_NO_MEMORY),
	STATUS(NV_ERR_NOT_SUPPORTED),
	STATUS(NV_ERR_OBJECT_NOT_FOUND),
	STATUS(NV_ERR_STATE_IN_USE),
};
#undef STATUS

static const char *status_name(uint32_t status)
{
	size_t i;

	for (i = 0; i < sizeof(status_names) / sizeof(status_names[0]); i++)
		if (status_names[i].code == status)
			return status_names[i].name;
	return "unknown";
}

/* ---------------------------------------------------------------------------------------- */
/* Time and signals */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static struct timespec ns_to_ts(uint64_t ns)
{
	struct timespec ts = {
		.tv_sec = (time_t)(ns / NSEC_PER_SEC),
		.tv_nsec = (long)(ns % NSEC_PER_SEC),
	};

	return ts;
}

static void on_signal(int sig)
{
	(void)sig;
	if (stop_count < 2)
		stop_count++;
}

static void install_signals(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	/* Restart ioctls; sleeps return early regardless, which is what the loops want. */
	sa.sa_flags = SA_RESTART;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
}

/* Sleep until a monotonic time, in chunks so that a signal landing just before a sleep
 * still stops us soon. */
static void sleep_until(uint64_t target)
{
	while (!stop_count) {
		uint64_t now = now_ns();
		struct timespec ts;

		if (now >= target)
			return;
		ts = ns_to_ts(target - now > SLEEP_CHUNK_NS ? now + SLEEP_CHUNK_NS : target);
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
	}
}

static void sleep_until_epoch(double epoch)
{
	struct timespec wall;
	double left;

	clock_gettime(CLOCK_REALTIME, &wall);
	left = epoch - ((double)wall.tv_sec + (double)wall.tv_nsec / 1e9);
	if (left <= 0)
		return;
	/*
	 * Converted once to the monotonic clock: processes started together use the same
	 * wall clock, and a clock step while we wait should not move our start.
	 */
	sleep_until(now_ns() + (uint64_t)(left * 1e9));
}

static void nap(const struct config *cfg)
{
	struct timespec ts = ns_to_ts((uint64_t)cfg->poll_us * 1000);

	clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* The driver */

/*
 * The driver looks only at the NR and the size of a request, but we build it as libcuda does.
 * _IOWR() itself would take sizeof() of its argument, so the size goes through _IOC().
 */
static int nv_ioctl(int fd, unsigned int nr, void *arg, size_t size)
{
	unsigned long req = _IOC(_IOC_READ | _IOC_WRITE, NVRM_IOCTL_MAGIC, nr, size);
	int ret;

	do {
		ioctl_counts[nr & 0xff]++;
		ret = ioctl(fd, req, arg);
	} while (ret == -1 && errno == EINTR);
	return ret;
}

static int open_node(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	return fd;
}

static uint32_t new_handle(struct gpu *g)
{
	return ++g->next_handle;
}

static void check_version(struct gpu *g)
{
	struct nvrm_api_version v;
	size_t i;
	int ret;

	memset(&v, 0, sizeof(v));
	v.cmd = NVRM_VERSION_CHECK_STRICT;
	memcpy(v.version, NVMOCK_VERSION_STRING, sizeof(NVMOCK_VERSION_STRING));
	ret = nv_ioctl(g->ctl, NV_ESC_CHECK_VERSION_STR, &v, sizeof(v));
	/* On a mismatch RM answers with its own version: keep it printable, on one line. */
	v.version[sizeof(v.version) - 1] = '\0';
	for (i = 0; v.version[i]; i++)
		if (v.version[i] < 0x20 || v.version[i] > 0x7e)
			v.version[i] = '?';
	if (ret)
		die("CHECK_VERSION_STR %s: %s (driver says \"%s\")", NVMOCK_VERSION_STRING,
		    strerror(errno), v.version);
	if (v.reply != NVRM_VERSION_REPLY_RECOGNIZED)
		die("CHECK_VERSION_STR %s: not recognized (reply %u, driver says \"%s\")",
		    NVMOCK_VERSION_STRING, v.reply, v.version);
}

static void set_sys_params(struct gpu *g)
{
	struct nvrm_sys_params sp = { .memblock_size = MEMBLOCK_SIZE };

	if (nv_ioctl(g->ctl, NV_ESC_SYS_PARAMS, &sp, sizeof(sp)))
		die("SYS_PARAMS: %s", strerror(errno));
}

static void find_card(struct gpu *g)
{
	struct nvrm_card_info cards[CARD_INFO_ENTRIES];
	unsigned int i;

	memset(cards, 0, sizeof(cards));
	if (nv_ioctl(g->ctl, NV_ESC_CARD_INFO, cards, sizeof(cards)))
		die("CARD_INFO: %s", strerror(errno));
	for (i = 0; i < CARD_INFO_ENTRIES; i++) {
		if (cards[i].valid && cards[i].minor_number == g->cfg->gpu) {
			g->gpu_id = cards[i].gpu_id;
			return;
		}
	}
	die("CARD_INFO: no GPU with minor number %u", g->cfg->gpu);
}

static void register_fd(struct gpu *g, int fd)
{
	struct nvrm_register_fd r = { .ctl_fd = g->ctl };

	if (nv_ioctl(fd, NV_ESC_REGISTER_FD, &r, sizeof(r)))
		die("REGISTER_FD on %s: %s", g->gpu_path, strerror(errno));
}

/* A GPU file that acts for our control file, as every /dev/nvidiaN open of libcuda's does. */
static int open_gpu_file(struct gpu *g)
{
	int fd = open_node(g->gpu_path);

	register_fd(g, fd);
	return fd;
}

static void attach_gpu(struct gpu *g)
{
	uint32_t ids[1] = { g->gpu_id };

	if (nv_ioctl(g->ctl, NV_ESC_ATTACH_GPUS_TO_FD, ids, sizeof(ids)))
		die("ATTACH_GPUS_TO_FD 0x%x: %s", g->gpu_id, strerror(errno));
}

/* RM_ALLOC as libcuda sends it (NVOS64); *handle 0 asks RM to pick. Returns RM's status. */
static uint32_t rm_alloc_status(struct gpu *g, uint32_t parent, uint32_t *handle, uint32_t cls,
				void *params, uint32_t size)
{
	struct nvos64_params p;

	memset(&p, 0, sizeof(p));
	p.hRoot = g->client;
	p.hObjectParent = parent;
	p.hObjectNew = *handle;
	p.hClass = cls;
	p.pAllocParms = (uintptr_t)params;
	p.paramsSize = size;
	if (nv_ioctl(g->ctl, NV_ESC_RM_ALLOC, &p, sizeof(p)))
		die("RM_ALLOC class 0x%x: %s", cls, strerror(errno));
	*handle = p.hObjectNew;
	return p.status;
}

static uint32_t rm_alloc(struct gpu *g, uint32_t parent, uint32_t cls, void *params,
			 uint32_t size)
{
	uint32_t handle = new_handle(g);
	uint32_t status = rm_alloc_status(g, parent, &handle, cls, params, size);

	if (status != NV_OK)
		die("RM_ALLOC class 0x%x: status 0x%x (%s)", cls, status, status_name(status));
	return handle;
}

static uint32_t rm_free_status(struct gpu *g, uint32_t parent, uint32_t handle)
{
	struct nvos00_params p = {
		.hRoot = g->client,
		.hObjectParent = parent,
		.hObjectOld = handle,
	};

	if (nv_ioctl(g->ctl, NV_ESC_RM_FREE, &p, sizeof(p)))
		die("RM_FREE 0x%x: %s", handle, strerror(errno));
	return p.status;
}

static void rm_free(struct gpu *g, uint32_t parent, uint32_t handle)
{
	uint32_t status = rm_free_status(g, parent, handle);

	if (status != NV_OK)
		die("RM_FREE 0x%x: status 0x%x (%s)", handle, status, status_name(status));
}

static void rm_control(struct gpu *g, uint32_t object, uint32_t cmd, void *params,
		       uint32_t size)
{
	struct nvos54_params p;

	memset(&p, 0, sizeof(p));
	p.hClient = g->client;
	p.hObject = object;
	p.cmd = cmd;
	p.params = (uintptr_t)params;
	p.paramsSize = size;
	if (nv_ioctl(g->ctl, NV_ESC_RM_CONTROL, &p, sizeof(p)))
		die("RM_CONTROL 0x%08x on 0x%x: %s", cmd, object, strerror(errno));
	if (p.status != NV_OK)
		die("RM_CONTROL 0x%08x on 0x%x: status 0x%x (%s)", cmd, object, p.status,
		    status_name(p.status));
}

/*
 * Map an object the way RM wants: a fresh file of its own (one mapping context per file) named
 * in RM_MAP_MEMORY on the control file, then mmap of that file at offset 0. System memory goes
 * through a control-node file, everything BAR-like through a GPU file.
 */
static void map_object_flags(struct gpu *g, struct mapping *m, bool sysmem, uint32_t hdevice,
			     uint32_t hmemory, size_t len, uint32_t flags, const char *what)
{
	struct nvos33_params_with_fd p;
	void *addr;
	int fd;

	fd = sysmem ? open_node(g->ctl_path) : open_gpu_file(g);
	memset(&p, 0, sizeof(p));
	p.hClient = g->client;
	p.hDevice = hdevice;
	p.hMemory = hmemory;
	p.offset = 0;
	p.length = len;
	p.flags = flags;
	p.fd = fd;
	if (nv_ioctl(g->ctl, NV_ESC_RM_MAP_MEMORY, &p, sizeof(p)))
		die("RM_MAP_MEMORY %s 0x%x: %s", what, hmemory, strerror(errno));
	if (p.status != NV_OK)
		die("RM_MAP_MEMORY %s 0x%x: status 0x%x (%s)", what, hmemory, p.status,
		    status_name(p.status));
	addr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED)
		die("mmap %s (%zu bytes): %s", what, len, strerror(errno));
	m->fd = fd;
	m->addr = addr;
	m->len = len;
}

static void map_object(struct gpu *g, struct mapping *m, bool sysmem, uint32_t hdevice,
		       uint32_t hmemory, size_t len, const char *what)
{
	map_object_flags(g, m, sysmem, hdevice, hmemory, len, 0, what);
}

static void unmap_object(struct mapping *m)
{
	if (m->addr)
		munmap(m->addr, m->len);
	if (m->fd >= 0)
		close(m->fd);
	m->addr = NULL;
	m->fd = -1;
}

/* ---------------------------------------------------------------------------------------- */
/* Setting up, in libcuda's order */

static void open_driver(struct gpu *g)
{
	uint32_t handle = 0;
	uint32_t status;

	g->ctl = open_node(g->ctl_path);
	check_version(g);
	set_sys_params(g);
	find_card(g);

	/* The client: RM names it. */
	status = rm_alloc_status(g, 0, &handle, NV01_ROOT_CLIENT, NULL, 0);
	if (status != NV_OK)
		die("RM_ALLOC class 0x%x: status 0x%x (%s)", NV01_ROOT_CLIENT, status,
		    status_name(status));
	if (!handle)
		die("RM_ALLOC class 0x%x: no client handle returned", NV01_ROOT_CLIENT);
	g->client = handle;

	/* RM lets a process allocate a device only while it holds the GPU's file open. */
	g->gpu_fd = open_gpu_file(g);
	attach_gpu(g);
}

static void alloc_device(struct gpu *g)
{
	struct nv0080_alloc_params dev;
	struct nv2080_alloc_params sub;
	uint8_t vaspace[VASPACE_PARAMS_SIZE];

	memset(&dev, 0, sizeof(dev));
	dev.deviceId = g->cfg->gpu;
	dev.hClientShare = g->client;	/* libcuda names its own client here */
	g->device = rm_alloc(g, g->client, NV01_DEVICE_0, &dev, sizeof(dev));

	memset(&sub, 0, sizeof(sub));
	sub.subDeviceId = 0;
	g->subdevice = rm_alloc(g, g->device, NV20_SUBDEVICE_0, &sub, sizeof(sub));

	g->usermode = rm_alloc(g, g->subdevice, HOPPER_USERMODE_A, NULL, 0);
	map_object(g, &g->usermode_map, false, g->subdevice, g->usermode, NVRM_USERMODE_SIZE,
		   "usermode");

	/*
	 * NV_VASPACE_ALLOCATION_PARAMETERS are required (RS_REQUIRED in resource_list.h; NULL is
	 * NV_ERR_INVALID_ARGUMENT, measured on an H100): zeroed, RM's defaults.
	 */
	memset(vaspace, 0, sizeof(vaspace));
	g->vaspace = rm_alloc(g, g->device, FERMI_VASPACE_A, vaspace, sizeof(vaspace));
}

static void alloc_sysmem(struct gpu *g)
{
	struct nv_memory_alloc_params mem;

	memset(&mem, 0, sizeof(mem));
	mem.owner = g->client;
	/* RM refuses system memory whose location is VIDMEM, attr's default (sysmemConstruct). */
	mem.attr = NVOS32_ATTR_LOCATION_PCI << NVOS32_ATTR_LOCATION_SHIFT;
	mem.size = (uint64_t)g->cfg->mem_mib << 20;
	g->sysmem = rm_alloc(g, g->device, NV01_MEMORY_SYSTEM, &mem, sizeof(mem));
	g->sysmem_va = mem.offset;
	/* What we asked for: RM may report a rounded-up size, and we map only what we use. */
	g->sysmem_size = (uint64_t)g->cfg->mem_mib << 20;
	/* The entry format carries 40 address bits, with bits 1:0 taken for other uses. */
	if (g->sysmem_va & 3)
		die("RM_ALLOC class 0x%x: GPU address 0x%" PRIx64 " is not 4-byte aligned",
		    NV01_MEMORY_SYSTEM, g->sysmem_va);
	if (g->sysmem_va > GP_ADDR_LIMIT - g->sysmem_size)
		die("RM_ALLOC class 0x%x: GPU address 0x%" PRIx64 " is beyond 40 bits",
		    NV01_MEMORY_SYSTEM, g->sysmem_va);
	map_object(g, &g->sysmem_map, true, g->device, g->sysmem, g->sysmem_size, "sysmem");
}

static void alloc_channel(struct gpu *g)
{
	struct nv_channel_group_alloc_params tsg;
	struct nv_ctxshare_alloc_params ctx;
	struct nv_channel_alloc_params ch;
	struct nvc36f_work_submit_token_params token;

	memset(&tsg, 0, sizeof(tsg));
	tsg.engineType = NV2080_ENGINE_TYPE_GRAPHICS;
	tsg.hVASpace = g->vaspace;
	g->tsg = rm_alloc(g, g->device, KEPLER_CHANNEL_GROUP_A, &tsg, sizeof(tsg));

	memset(&ctx, 0, sizeof(ctx));
	ctx.hVASpace = g->vaspace;
	g->ctxshare = rm_alloc(g, g->tsg, FERMI_CONTEXT_SHARE_A, &ctx, sizeof(ctx));

	memset(&ch, 0, sizeof(ch));
	ch.gpFifoOffset = g->sysmem_va + RING_OFFSET;
	ch.gpFifoEntries = GPFIFO_ENTRIES;
	/* Like libcuda: not on the runlist until GPFIFO_SCHEDULE, once all is in place. */
	ch.flags = NVOS04_FLAGS_DELAY_CHANNEL_SCHEDULING;
	/* Its VA space is the context share's: RM refuses a channel that names both. */
	ch.hContextShare = g->ctxshare;
	ch.hUserdMemory[0] = 0;		/* RM allocates USERD; we map the channel for it */
	if (g->cfg->userd_client) {
		struct nv_memory_alloc_params mem;

		/*
		 * As libcuda: a 512-byte slot in a video memory object of our own, mapped
		 * (through BAR1) before the channel is made; the channel is never mapped.
		 */
		memset(&mem, 0, sizeof(mem));
		mem.owner = g->client;
		mem.size = USERD_MEM_SIZE;
		g->userd_mem = rm_alloc(g, g->device, NV01_MEMORY_LOCAL_USER, &mem, sizeof(mem));
		map_object(g, &g->userd_map, false, g->device, g->userd_mem, USERD_MEM_SIZE,
			   "USERD memory");
		ch.hUserdMemory[0] = g->userd_mem;
		ch.userdOffset[0] = g->cfg->userd_offset;
	}
	ch.engineType = NV2080_ENGINE_TYPE_GRAPHICS;
	g->channel = rm_alloc(g, g->tsg, HOPPER_CHANNEL_GPFIFO_A, &ch, sizeof(ch));

	g->compute = rm_alloc(g, g->channel, HOPPER_COMPUTE_A, NULL, 0);
	g->copy = rm_alloc(g, g->channel, HOPPER_DMA_COPY_A, NULL, 0);

	memset(&token, 0, sizeof(token));
	rm_control(g, g->channel, NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, &token,
		   sizeof(token));
	g->token = token.workSubmitToken;

	if (!g->cfg->userd_client)
		map_object(g, &g->userd_map, false, g->subdevice, g->channel, USERD_MAP_SIZE,
			   "USERD");
}

static void schedule_tsg(struct gpu *g)
{
	struct nva06c_gpfifo_schedule_params sched;

	memset(&sched, 0, sizeof(sched));
	sched.bEnable = 1;
	rm_control(g, g->tsg, NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, &sched, sizeof(sched));
}

static uint32_t alloc_vidmem(struct gpu *g, unsigned long mib, uint32_t *handle)
{
	struct nv_memory_alloc_params mem;

	memset(&mem, 0, sizeof(mem));
	mem.owner = g->client;
	mem.size = (uint64_t)mib << 20;
	*handle = new_handle(g);
	return rm_alloc_status(g, g->device, handle, NV01_MEMORY_LOCAL_USER, &mem, sizeof(mem));
}

/* Allocate and free device memory, so that a test can watch the driver's accounting move. */
static void vidmem_steps(struct gpu *g)
{
	unsigned int i;

	for (i = 0; i < g->cfg->steps; i++) {
		uint32_t handle;
		uint32_t status = alloc_vidmem(g, g->cfg->vidmem_mib, &handle);

		if (status != NV_OK)
			die("RM_ALLOC class 0x%x: status 0x%x (%s)", NV01_MEMORY_LOCAL_USER,
			    status, status_name(status));
		rm_free(g, g->device, handle);
	}
}

/* Held for the whole run; a refusal is an answer the test wants, not a failure. */
static void vidmem_hold(struct gpu *g)
{
	uint32_t handle;

	if (!g->cfg->vidmem_hold_mib)
		return;
	g->hold_tried = true;
	g->hold_status = alloc_vidmem(g, g->cfg->vidmem_hold_mib, &handle);
}

/* ---------------------------------------------------------------------------------------- */
/* --tree cuda: the H200 trace's object tree and control order (CUDA_SEQUENCE.md) */

static void cuda_device(struct gpu *g)
{
	struct nv0080_alloc_params dev;
	struct nv2080_alloc_params sub;
	uint8_t usermode[USERMODE_PARAMS_SIZE];
	uint8_t vaspace[VASPACE_PARAMS_SIZE];

	memset(&dev, 0, sizeof(dev));
	dev.deviceId = g->cfg->gpu;
	dev.hClientShare = g->client;
	dev.vaMode = NV0080_VA_MODE_MULTI;
	g->device = rm_alloc(g, g->client, NV01_DEVICE_0, &dev, sizeof(dev));

	memset(&sub, 0, sizeof(sub));
	g->subdevice = rm_alloc(g, g->device, NV20_SUBDEVICE_0, &sub, sizeof(sub));

	/* Two usermode windows: the doorbell page, then one through BAR1 (bBar1Mapping = 1). */
	g->usermode = rm_alloc(g, g->subdevice, HOPPER_USERMODE_A, NULL, 0);
	map_object_flags(g, &g->usermode_map, false, g->subdevice, g->usermode,
			 NVRM_USERMODE_SIZE, CUDA_MAP_USERMODE, "usermode");
	memset(usermode, 0, sizeof(usermode));
	usermode[0] = 1;
	g->usermode2 = rm_alloc(g, g->subdevice, HOPPER_USERMODE_A, usermode, sizeof(usermode));
	map_object_flags(g, &g->usermode2_map, false, g->subdevice, g->usermode2,
			 NVRM_USERMODE_SIZE, CUDA_MAP_USERMODE_BAR1, "usermode (BAR1)");

	/* Two VA spaces, both with parameters; the first is the context's. */
	memset(vaspace, 0, sizeof(vaspace));
	g->vaspace = rm_alloc(g, g->device, FERMI_VASPACE_A, vaspace, sizeof(vaspace));
	g->vaspace2 = rm_alloc(g, g->device, FERMI_VASPACE_A, vaspace, sizeof(vaspace));
}

static uint32_t cuda_tsg(struct gpu *g, uint32_t engine, uint32_t hvaspace)
{
	struct nv_channel_group_alloc_params tsg;

	memset(&tsg, 0, sizeof(tsg));
	tsg.engineType = engine;
	tsg.hVASpace = hvaspace;
	return rm_alloc(g, g->device, KEPLER_CHANNEL_GROUP_A, &tsg, sizeof(tsg));
}

/* The 2 MiB of video memory that holds every channel's ring and USERD, mapped through BAR1. */
static void cuda_userd_memory(struct gpu *g)
{
	struct nv_memory_alloc_params mem;

	memset(&mem, 0, sizeof(mem));
	mem.owner = g->client;
	mem.flags = CUDA_VID_FLAGS;
	mem.attr = CUDA_VID_ATTR;
	mem.attr2 = CUDA_VID_ATTR2;
	mem.size = CUDA_USERD_MEM_SIZE;
	mem.alignment = CUDA_VID_ALIGN;
	g->userd_mem = rm_alloc(g, g->device, NV01_MEMORY_LOCAL_USER, &mem, sizeof(mem));
	g->userd_va = mem.offset;
	if (g->userd_va & 3 || g->userd_va > GP_ADDR_LIMIT - CUDA_USERD_MEM_SIZE)
		die("RM_ALLOC class 0x%x: GPU address 0x%" PRIx64 " unusable for a ring",
		    NV01_MEMORY_LOCAL_USER, g->userd_va);
	map_object_flags(g, &g->userd_map, false, g->subdevice, g->userd_mem, CUDA_USERD_MEM_SIZE,
			 CUDA_MAP_VIDMEM, "USERD memory");
}

/* A channel's error notifier: 4 KiB of system memory owned by the device, mapped. */
static uint32_t cuda_notifier(struct gpu *g)
{
	struct nv_memory_alloc_params mem;
	uint32_t handle;

	memset(&mem, 0, sizeof(mem));
	mem.owner = g->device;
	mem.type = CUDA_NOTIFIER_TYPE;
	mem.flags = CUDA_SYS_FLAGS;
	mem.attr = CUDA_SYS_ATTR;
	mem.attr2 = CUDA_SYS_ATTR2;
	mem.size = CUDA_NOTIFIER_SIZE;
	mem.alignment = CUDA_NOTIFIER_SIZE;
	handle = rm_alloc(g, g->device, NV01_MEMORY_SYSTEM, &mem, sizeof(mem));
	if (g->nnotifiers >= CUDA_CHANNELS)
		die("internal error: more than %u notifiers", CUDA_CHANNELS);
	map_object_flags(g, &g->notifier_maps[g->nnotifiers++], true, g->device, handle,
			 CUDA_NOTIFIER_SIZE, CUDA_MAP_SYSMEM, "notifier");
	return handle;
}

/* What libcuda asks RM about each engine object it adds to a channel: its class and engine. */
static void cuda_engine_object(struct gpu *g, uint32_t channel, uint32_t cls, void *params,
			       uint32_t size, uint32_t engine)
{
	struct nv906f_class_engineid_params id;

	memset(&id, 0, sizeof(id));
	id.hObject = rm_alloc(g, channel, cls, params, size);
	rm_control(g, channel, NV906F_CTRL_GET_CLASS_ENGINEID, &id, sizeof(id));
	if (id.classID != cls || id.engineID != engine)
		die("GET_CLASS_ENGINEID of 0x%x: class 0x%x engine 0x%x, not 0x%x on 0x%x",
		    id.hObject, id.classID, id.engineID, cls, engine);
}

/* The channel's ID, as libcuda asks for it after each channel (the device's channel list). */
static uint32_t cuda_channel_id(struct gpu *g, uint32_t channel)
{
	struct nv0080_channellist_params list;
	uint32_t handle = channel, chid = 0;

	memset(&list, 0, sizeof(list));
	list.numChannels = 1;
	list.pChannelHandleList = (uintptr_t)&handle;
	list.pChannelList = (uintptr_t)&chid;
	rm_control(g, g->device, NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST, &list, sizeof(list));
	if (chid == NV0080_CTRL_FIFO_GET_CHANNELLIST_INVALID_CHANNEL)
		die("GET_CHANNELLIST: no ID for channel 0x%x", channel);
	return chid;
}

/*
 * Channel n of the process, in libcuda's order (CUDA_SEQUENCE.md): notifier, channel with client
 * USERD, its ID, its engine objects each with its class and engine, its token, and for a
 * compute channel the size of its GR context. Returns the channel; *token gets its work-submit
 * token.
 */
static uint32_t cuda_channel(struct gpu *g, unsigned int n, uint32_t tsg, uint32_t ctxshare,
			     uint32_t engine, uint32_t flags, bool compute, uint32_t *token)
{
	/* VERSION_0, so engineType is a CE instance. */
	struct nvb0b5_alloc_params copy = {
		.version = NVB0B5_ALLOCATION_PARAMETERS_VERSION_0,
		.engineType = compute ? CUDA_GR_COPY_CE : engine - NV2080_ENGINE_TYPE_COPY0,
	};
	uint8_t gr[GR_PARAMS_SIZE];
	struct nv_channel_alloc_params ch;
	struct nvc36f_work_submit_token_params tok;
	struct nv2080_ctx_buffer_size_params ctx;
	uint32_t notifier = cuda_notifier(g);
	uint32_t channel, chid;

	memset(&ch, 0, sizeof(ch));
	ch.hObjectError = notifier;
	ch.hObjectBuffer = g->userd_mem;
	ch.gpFifoOffset = g->userd_va + (uint64_t)n * CUDA_CHANNEL_STRIDE;
	ch.gpFifoEntries = CUDA_ENTRIES;
	ch.flags = flags;
	ch.hContextShare = ctxshare;
	ch.hUserdMemory[0] = g->userd_mem;
	ch.userdOffset[0] = (uint64_t)n * CUDA_CHANNEL_STRIDE + CUDA_USERD_IN_STRIDE;
	ch.engineType = engine;
	channel = rm_alloc(g, tsg, HOPPER_CHANNEL_GPFIFO_A, &ch, sizeof(ch));
	chid = cuda_channel_id(g, channel);
	if (compute) {
		memset(gr, 0, sizeof(gr));	/* version 0, no flags */
		cuda_engine_object(g, channel, HOPPER_COMPUTE_A, gr, sizeof(gr),
				   NV2080_ENGINE_TYPE_GRAPHICS);
	}
	cuda_engine_object(g, channel, HOPPER_DMA_COPY_A, &copy, sizeof(copy),
			   NV2080_ENGINE_TYPE_COPY0 + copy.engineType);
	memset(&tok, 0, sizeof(tok));
	rm_control(g, channel, NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, &tok, sizeof(tok));
	*token = tok.workSubmitToken;
	/* The token is (runlist << 16) | ID (kchannelCtrlCmdGpfifoGetWorkSubmitToken). */
	if ((*token & 0xffff) != chid)
		die("channel 0x%x: ID %u, but its work-submit token is 0x%x", channel, chid, *token);
	if (compute) {
		memset(&ctx, 0, sizeof(ctx));
		ctx.hChannel = channel;
		rm_control(g, g->subdevice, NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE, &ctx,
			   sizeof(ctx));
	}
	return channel;
}

static void cuda_schedule(struct gpu *g, uint32_t tsg)
{
	struct nva06c_gpfifo_schedule_params sched;

	memset(&sched, 0, sizeof(sched));
	sched.bEnable = 1;
	rm_control(g, tsg, NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, &sched, sizeof(sched));
}

static void setup_cuda(struct gpu *g)
{
	struct nv2080_ecc_status_params ecc;
	struct nv_ctxshare_alloc_params ctx;
	struct nv2080_ctxsw_preemption_mode_params preempt;
	struct nva06c_timeslice_params slice;
	unsigned int n = 0, i, k;
	uint32_t token;

	cuda_device(g);

	/* The compute TSG and its context share, then the memory its channels live in. */
	g->tsg = cuda_tsg(g, NV2080_ENGINE_TYPE_GRAPHICS, 0);
	memset(&ctx, 0, sizeof(ctx));
	ctx.hVASpace = g->vaspace;
	ctx.flags = NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC;	/* the trace's: flags 1 */
	g->ctxshare = rm_alloc(g, g->tsg, FERMI_CONTEXT_SHARE_A, &ctx, sizeof(ctx));
	cuda_userd_memory(g);
	alloc_sysmem(g);	/* pushbuffers and the semaphore (CUDA's are elsewhere) */

	for (i = 0; i < CUDA_GR_CHANNELS; i++, n++) {
		uint32_t ch = cuda_channel(g, n, g->tsg, g->ctxshare, NV2080_ENGINE_TYPE_GRAPHICS,
					   CUDA_CH_FLAGS | (i & 1 ? CUDA_CH_RUNQUEUE1 : 0), true,
					   &token);

		if (!i) {	/* work goes to the first channel */
			g->channel = ch;
			g->token = token;
		}
	}
	cuda_schedule(g, g->tsg);

	for (k = 0; k < CUDA_CE_TSGS; k++) {
		uint32_t engine = CUDA_CE_ENGINE_FIRST + k;
		uint32_t tsg = cuda_tsg(g, engine, g->vaspace);

		for (i = 0; i < CUDA_CE_CHANNELS; i++, n++)
			cuda_channel(g, n, tsg, 0, engine, CUDA_CH_FLAGS, false, &token);
		cuda_schedule(g, tsg);
	}

	/* libcuda then asks for the GPU's ECC state, twice (the trace's lines 2782, 2783). */
	for (i = 0; i < 2; i++) {
		memset(&ecc, 0, sizeof(ecc));
		rm_control(g, g->subdevice, NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS, &ecc,
			   sizeof(ecc));
	}

	/* At the first launch: CILP for the compute TSG, and its timeslice. */
	memset(&preempt, 0, sizeof(preempt));
	preempt.flags = NV2080_CTXSW_PREEMPTION_FLAG_CILP;
	preempt.hChannel = g->tsg;
	preempt.cilpPreemptMode = NV2080_CTXSW_PREEMPTION_COMPUTE_CILP;
	rm_control(g, g->subdevice, NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE, &preempt,
		   sizeof(preempt));
	memset(&slice, 0, sizeof(slice));
	slice.timesliceUs = CUDA_TIMESLICE_US;
	rm_control(g, g->tsg, NVA06C_CTRL_CMD_SET_TIMESLICE, &slice, sizeof(slice));

	g->entries = CUDA_ENTRIES;
	g->ring_offset = 0;
	g->userd_offset = CUDA_USERD_IN_STRIDE;
}

static void setup(struct gpu *g)
{
	open_driver(g);
	if (g->cfg->tree == TREE_CUDA) {
		setup_cuda(g);
	} else {
		alloc_device(g);
		alloc_sysmem(g);
		alloc_channel(g);
		schedule_tsg(g);
		g->entries = GPFIFO_ENTRIES;
		g->ring_offset = RING_OFFSET;
		g->userd_offset = g->cfg->userd_client ? g->cfg->userd_offset : 0;
	}
	vidmem_steps(g);
	vidmem_hold(g);
}

static void teardown(struct gpu *g)
{
	/* Freeing the client frees everything under it, channels and memory included. */
	if (!g->cfg->no_free)
		rm_free(g, g->client, g->client);
	unmap_object(&g->usermode_map);
	unmap_object(&g->sysmem_map);
	unmap_object(&g->userd_map);
	unmap_object(&g->usermode2_map);
	while (g->nnotifiers)
		unmap_object(&g->notifier_maps[--g->nnotifiers]);
	close(g->gpu_fd);
	close(g->ctl);
}

/* ---------------------------------------------------------------------------------------- */
/* Submitting work */

static size_t seg_stride(unsigned int kernels)
{
	size_t bytes = ((size_t)kernels * 2 + SEG_TAIL_WORDS) * sizeof(uint32_t);

	return (bytes + SEG_ALIGN - 1) & ~(size_t)(SEG_ALIGN - 1);
}

static unsigned int kernels_per_batch(const struct config *cfg)
{
	return cfg->shape == SHAPE_SATURATE ? cfg->sync_every : cfg->kernels;
}

/*
 * A segment is rewritten only once its batch is done: we never have more than `queue` batches
 * out (one in the requests shape), so `queue` slots would do; one more costs nothing.
 */
static unsigned int segment_count(const struct config *cfg)
{
	return (cfg->shape == SHAPE_SATURATE ? cfg->queue : 1) + 1;
}

static void submitter_init(struct submitter *s, const struct gpu *g)
{
	uint8_t *base = g->sysmem_map.addr;
	uint8_t *ring_base = g->cfg->tree == TREE_CUDA ? g->userd_map.addr : base;
	uint8_t *userd = (uint8_t *)g->userd_map.addr + g->userd_offset;

	memset(s, 0, sizeof(*s));
	s->ring = (uint32_t *)(ring_base + g->ring_offset);
	s->entries = g->entries;
	s->sem = (volatile uint32_t *)(base + SEM_OFFSET);
	s->sem_va = g->sysmem_va + SEM_OFFSET;
	s->segs = base + SEG_OFFSET;
	s->segs_va = g->sysmem_va + SEG_OFFSET;
	s->kernels = kernels_per_batch(g->cfg);
	s->kernel_us = g->cfg->kernel_us;
	s->seg_stride = seg_stride(s->kernels);
	s->nseg = segment_count(g->cfg);
	s->submit_ns = calloc(s->nseg, sizeof(*s->submit_ns));
	if (!s->submit_ns)
		die("out of memory");
	s->gp_get = (volatile uint32_t *)(userd + NVRM_USERD_GP_GET);
	s->gp_put = (volatile uint32_t *)(userd + NVRM_USERD_GP_PUT);
	s->doorbell = (volatile uint32_t *)((uint8_t *)g->usermode_map.addr +
					    NVRM_USERMODE_DOORBELL);
	s->token = g->token;
	*s->sem = 0;
	/* A new channel's ring is empty: we put where the engine will get. */
	s->put = *s->gp_get % s->entries;
}

static unsigned int ring_free(const struct submitter *s)
{
	uint32_t get = *s->gp_get % s->entries;
	uint32_t used = (s->put + s->entries - get) % s->entries;

	return s->entries - 1 - used;
}

static uint64_t inflight(const struct submitter *s)
{
	return s->submitted - s->completed;
}

static void submit_batch(struct submitter *s)
{
	uint64_t batch = s->submitted + 1;
	unsigned int slot = batch % s->nseg;
	uint32_t *pb = (uint32_t *)(s->segs + slot * s->seg_stride);
	uint64_t va = s->segs_va + slot * s->seg_stride;
	uint32_t *entry = s->ring + 2 * s->put;
	uint32_t words = 0;
	unsigned int i;

	for (i = 0; i < s->kernels; i++) {
		pb[words++] = NVMOCK_METHOD_RUN_US;
		pb[words++] = s->kernel_us;
	}
	pb[words++] = NVMOCK_METHOD_SEM_ADDR_LO;
	pb[words++] = (uint32_t)s->sem_va;
	pb[words++] = NVMOCK_METHOD_SEM_ADDR_HI;
	pb[words++] = (uint32_t)(s->sem_va >> 32);
	pb[words++] = NVMOCK_METHOD_SEM_RELEASE;
	pb[words++] = (uint32_t)batch;

	entry[0] = (uint32_t)va & ~3u;
	entry[1] = (uint32_t)((va >> 32) & 0xff) |
		   ((words & NVRM_GP_ENTRY1_LENGTH_MASK) << NVRM_GP_ENTRY1_LENGTH_SHIFT);
	s->put = (s->put + 1) % s->entries;

	s->submit_ns[slot] = now_ns();
	/* The engine may read the entry and segment as soon as it sees GP_PUT move. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	*s->gp_put = s->put;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	*s->doorbell = s->token;
	s->submitted = batch;
}

static void record(struct results *r, double lat_ms, double done_s)
{
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 1024;
		double *lat = realloc(r->lat_ms, cap * sizeof(*lat));
		double *done;

		if (!lat)
			die("out of memory");
		r->lat_ms = lat;
		done = realloc(r->done_s, cap * sizeof(*done));
		if (!done)
			die("out of memory");
		r->done_s = done;
		r->cap = cap;
	}
	r->lat_ms[r->n] = lat_ms;
	r->done_s[r->n] = done_s;
	r->n++;
}

/*
 * Take in the batches the semaphore says are done. It holds the low 32 bits of a batch number,
 * compared as a sequence number. Results go to r unless it is NULL (draining).
 */
static unsigned int reap(struct submitter *s, struct results *r)
{
	uint32_t sem = *s->sem;
	unsigned int done = 0;
	uint64_t now;

	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	now = now_ns();
	while (s->completed < s->submitted &&
	       (int32_t)(sem - (uint32_t)(s->completed + 1)) >= 0) {
		s->completed++;
		done++;
		if (r) {
			uint64_t sent = s->submit_ns[s->completed % s->nseg];

			record(r, (double)(now - sent) / 1e6, (double)(now - r->t0) / 1e9);
			r->kernels += s->kernels;
		}
	}
	return done;
}

static void check_stall(const struct submitter *s, const struct config *cfg, uint64_t now,
			uint64_t last_progress)
{
	if ((double)(now - last_progress) / 1e9 < cfg->timeout)
		return;
	die("no progress for %g s: batch %" PRIu64 " not done (semaphore %u, GP_GET %u, "
	    "GP_PUT %u)", cfg->timeout, s->completed + 1, *s->sem, *s->gp_get, s->put);
}

static void run_saturate(struct submitter *s, const struct config *cfg, struct results *r)
{
	uint64_t deadline = r->t0 + (uint64_t)(cfg->seconds * 1e9);
	uint64_t last_progress = r->t0;

	for (;;) {
		uint64_t now = now_ns();

		if (stop_count) {
			r->interrupted = true;
			break;
		}
		if (now >= deadline)
			break;
		if (reap(s, r))
			last_progress = now;
		if (inflight(s) < cfg->queue && ring_free(s)) {
			if (!inflight(s))
				last_progress = now;
			submit_batch(s);
			continue;
		}
		check_stall(s, cfg, now, last_progress);
		nap(cfg);
	}
	r->end = now_ns();
}

/* Wait for everything submitted; false if a signal cut the wait short. */
static bool wait_idle(struct submitter *s, const struct config *cfg, struct results *r)
{
	uint64_t last_progress = now_ns();

	for (;;) {
		uint64_t now;

		reap(s, r);
		if (!inflight(s))
			return true;
		if (stop_count)
			return false;
		now = now_ns();
		check_stall(s, cfg, now, last_progress);
		nap(cfg);
	}
}

static void wait_ring_space(struct submitter *s, const struct config *cfg)
{
	uint64_t since = now_ns();

	while (!ring_free(s) && !stop_count) {
		check_stall(s, cfg, now_ns(), since);
		nap(cfg);
	}
}

static double next_gap_s(const struct config *cfg)
{
	if (!cfg->poisson)
		return 1.0 / cfg->rate_hz;
	/* Exponential gaps: 1 - drand48() is in (0, 1], so the log is finite. */
	return -log(1.0 - drand48()) / cfg->rate_hz;
}

/*
 * One batch at a time on a schedule fixed from the start (no drift); a request that finds us
 * late goes out at once. Requests stop being issued at the deadline, but the last one is waited
 * for, so that slow answers are not the ones left out.
 */
static void run_requests(struct submitter *s, const struct config *cfg, struct results *r)
{
	uint64_t deadline = r->t0 + (uint64_t)(cfg->seconds * 1e9);
	double offset_s = 0;

	for (;;) {
		uint64_t when = r->t0 + (uint64_t)(offset_s * 1e9);

		/* A late schedule lags the clock: the deadline is the clock's. */
		if (when >= deadline || now_ns() >= deadline)
			break;
		sleep_until(when);
		if (!stop_count)
			wait_ring_space(s, cfg);
		if (stop_count)
			break;
		submit_batch(s);
		if (!wait_idle(s, cfg, r))
			break;
		offset_s += next_gap_s(cfg);
	}
	r->end = now_ns();
	/* The idle time after the last request is part of the window we measured. */
	if (stop_count)
		r->interrupted = true;
	else if (r->end < deadline)
		r->end = deadline;
}

/* Let what is still out finish before the channel is freed, as cuCtxDestroy does; bounded,
 * and cut short by a second signal. */
static void drain(struct submitter *s, const struct config *cfg, struct results *r)
{
	uint64_t until = now_ns() + DRAIN_NS;

	while (inflight(s) && stop_count < 2 && now_ns() < until) {
		reap(s, NULL);
		if (inflight(s))
			nap(cfg);
	}
	r->inflight_at_exit = inflight(s);
}

/* ---------------------------------------------------------------------------------------- */
/* Output */

static void print_json_string(const char *str)
{
	const unsigned char *p;

	putchar('"');
	for (p = (const unsigned char *)str; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Nearest rank: the smallest sample with at least p percent of them at or below it. */
static double percentile(const double *sorted, size_t n, double p)
{
	size_t rank = (size_t)ceil(p / 100.0 * (double)n);

	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return sorted[rank - 1];
}

static void print_latency(const struct results *r)
{
	double *sorted, sum = 0;
	size_t i;

	printf(",\"requests\":%zu", r->n);
	if (!r->n) {
		printf(",\"p50_ms\":null,\"p99_ms\":null,\"max_ms\":null,\"mean_ms\":null");
		return;
	}
	sorted = malloc(r->n * sizeof(*sorted));
	if (!sorted)
		die("out of memory");
	memcpy(sorted, r->lat_ms, r->n * sizeof(*sorted));
	qsort(sorted, r->n, sizeof(*sorted), cmp_double);
	for (i = 0; i < r->n; i++)
		sum += sorted[i];
	printf(",\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"max_ms\":%.4f,\"mean_ms\":%.4f",
	       percentile(sorted, r->n, 50), percentile(sorted, r->n, 99), sorted[r->n - 1],
	       sum / (double)r->n);
	free(sorted);
}

static void print_ioctls(void)
{
	bool first = true;
	unsigned int nr;

	printf(",\"ioctls\":{");
	for (nr = 0; nr < 256; nr++) {
		if (!ioctl_counts[nr])
			continue;
		printf("%s\"0x%x\":%lu", first ? "" : ",", nr, ioctl_counts[nr]);
		first = false;
	}
	putchar('}');
}

static void print_report(const struct config *cfg, const struct gpu *g, const struct results *r)
{
	double elapsed = r->end > r->t0 ? (double)(r->end - r->t0) / 1e9 : 0;
	double busy_s = (double)r->kernels * cfg->kernel_us / 1e6;
	size_t i;

	printf("{\"label\":");
	print_json_string(cfg->label);
	printf(",\"pid\":%d,\"gpu\":%u,\"gpu_id\":\"0x%x\"", (int)getpid(), cfg->gpu, g->gpu_id);
	printf(",\"shape\":\"%s\"", cfg->shape == SHAPE_SATURATE ? "saturate" : "requests");
	printf(",\"tree\":\"%s\"", cfg->tree == TREE_CUDA ? "cuda" : "simple");
	printf(",\"kernel_us\":%u,\"sync_every\":%u,\"queue\":%u,\"kernels_per_request\":%u",
	       cfg->kernel_us, cfg->sync_every, cfg->queue, cfg->kernels);
	printf(",\"rate_hz\":%.3f,\"poisson\":%s", cfg->rate_hz, cfg->poisson ? "true" : "false");
	printf(",\"seconds\":%.3f,\"elapsed_s\":%.5f,\"interrupted\":%s", cfg->seconds, elapsed,
	       r->interrupted ? "true" : "false");
	printf(",\"batches\":%zu,\"kernels\":%" PRIu64, r->n, r->kernels);
	printf(",\"kernels_per_s\":%.3f,\"busy_fraction\":%.5f",
	       elapsed > 0 ? (double)r->kernels / elapsed : 0.0,
	       elapsed > 0 ? busy_s / elapsed : 0.0);
	print_latency(r);
	printf(",\"client\":\"0x%08x\",\"token\":\"0x%x\"", g->client, g->token);
	printf(",\"steps\":%u", cfg->steps);
	if (g->hold_tried)
		printf(",\"vidmem_hold_mib\":%lu,\"vidmem_status\":\"0x%x\","
		       "\"vidmem_status_name\":\"%s\"", cfg->vidmem_hold_mib, g->hold_status,
		       status_name(g->hold_status));
	printf(",\"inflight_at_exit\":%" PRIu64 ",\"freed\":%s", r->inflight_at_exit,
	       cfg->no_free ? "false" : "true");
	print_ioctls();
	if (cfg->timeline) {
		printf(",\"timeline\":[");
		for (i = 0; i < r->n; i++)
			printf("%s%.5f", i ? "," : "", r->done_s[i]);
		putchar(']');
		/* Each request's latency beside its completion: where in the run the slow ones fell. */
		if (cfg->shape == SHAPE_REQUESTS) {
			printf(",\"latencies_ms\":[");
			for (i = 0; i < r->n; i++)
				printf("%s%.4f", i ? "," : "", r->lat_ms[i]);
			putchar(']');
		}
	}
	printf("}\n");
	if (fflush(stdout) || ferror(stdout))
		die("writing the report: %s", strerror(errno));
}

/* ---------------------------------------------------------------------------------------- */
/* Options */

enum {
	OPT_DEV_DIR = 256,
	OPT_GPU,
	OPT_SHAPE,
	OPT_SECONDS,
	OPT_START_AT,
	OPT_LABEL,
	OPT_KERNEL_US,
	OPT_SYNC_EVERY,
	OPT_QUEUE,
	OPT_RATE_HZ,
	OPT_POISSON,
	OPT_KERNELS,
	OPT_MEM_MIB,
	OPT_STEPS,
	OPT_VIDMEM_MIB,
	OPT_VIDMEM_HOLD,
	OPT_NO_FREE,
	OPT_TIMELINE,
	OPT_TIMEOUT,
	OPT_POLL_US,
	OPT_SEED,
	OPT_USERD,
	OPT_USERD_OFFSET,
	OPT_TREE,
};

static const struct option long_options[] = {
	{ "dev-dir", required_argument, NULL, OPT_DEV_DIR },
	{ "gpu", required_argument, NULL, OPT_GPU },
	{ "shape", required_argument, NULL, OPT_SHAPE },
	{ "seconds", required_argument, NULL, OPT_SECONDS },
	{ "start-at", required_argument, NULL, OPT_START_AT },
	{ "label", required_argument, NULL, OPT_LABEL },
	{ "kernel-us", required_argument, NULL, OPT_KERNEL_US },
	{ "sync-every", required_argument, NULL, OPT_SYNC_EVERY },
	{ "queue", required_argument, NULL, OPT_QUEUE },
	{ "rate-hz", required_argument, NULL, OPT_RATE_HZ },
	{ "poisson", no_argument, NULL, OPT_POISSON },
	{ "kernels", required_argument, NULL, OPT_KERNELS },
	{ "mem-mib", required_argument, NULL, OPT_MEM_MIB },
	{ "steps", required_argument, NULL, OPT_STEPS },
	{ "vidmem-mib", required_argument, NULL, OPT_VIDMEM_MIB },
	{ "vidmem-mib-hold", required_argument, NULL, OPT_VIDMEM_HOLD },
	{ "no-free", no_argument, NULL, OPT_NO_FREE },
	{ "timeline", no_argument, NULL, OPT_TIMELINE },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "poll-us", required_argument, NULL, OPT_POLL_US },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "userd", required_argument, NULL, OPT_USERD },
	{ "userd-offset", required_argument, NULL, OPT_USERD_OFFSET },
	{ "tree", required_argument, NULL, OPT_TREE },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static void print_help(void)
{
	printf("Usage: gpuload [OPTION]...\n"
	       "Drive an NVIDIA RM driver (nvmock.ko) like a CUDA process: set up a client,\n"
	       "device, TSG and Hopper channel by ioctl, submit work through GPFIFO, USERD and\n"
	       "the usermode doorbell, and print one JSON object with what was done.\n"
	       "\n"
	       "  --dev-dir DIR          device nodes directory (default /dev)\n"
	       "  --gpu N                GPU minor number and device index (default 0)\n"
	       "  --shape SHAPE          saturate (default) or requests\n"
	       "  --seconds S            length of the timed loop (default 5)\n"
	       "  --start-at EPOCH       set up, then start the loop at this wall-clock time\n"
	       "  --label NAME           copied into the report\n"
	       "  --kernel-us N          length of one kernel in microseconds (default 500)\n"
	       "  --sync-every N         saturate: kernels per batch (default 8)\n"
	       "  --queue N              saturate: batches kept in flight (default 2, max %u)\n"
	       "  --rate-hz R            requests: requests per second (default 50)\n"
	       "  --poisson              requests: exponential gaps instead of a fixed interval\n"
	       "  --kernels N            requests: kernels per request (default 1)\n"
	       "  --mem-mib N            sysmem for ring and pushbuffers (default 2, max %u)\n"
	       "  --steps N              allocate and free device memory N times before the loop\n"
	       "  --vidmem-mib N         size of each of those (default 1)\n"
	       "  --vidmem-mib-hold M    hold M MiB of device memory during the run; a refusal\n"
	       "                         is reported as vidmem_status, not an error\n"
	       "  --no-free              leave the client for the driver to free on close\n"
	       "  --timeline             report the completion time of each batch (and, for\n"
	       "                         requests, each one's latency)\n"
	       "  --timeout S            fail if the GPU makes no progress for S s (default 30)\n"
	       "  --poll-us N            sleep between completion polls (default 20)\n"
	       "  --seed N               seed for --poisson (default: from pid and time)\n"
	       "  --userd rm|client      rm (default): RM's USERD, mapped by mapping the channel;\n"
	       "                         client: a slot in our own 2 MiB of video memory, as libcuda\n"
	       "  --userd-offset N       --userd=client: the slot's offset (default 0x2000, a\n"
	       "                         multiple of 512)\n"
	       "  --tree TREE            simple (default): a TSG and a channel; cuda: the object\n"
	       "                         tree and control order of CUDA on an H200\n"
	       "  -h, --help             this text\n"
	       "\n"
	       "Exit status: 0 done (also when stopped by SIGTERM/SIGINT), 1 driver or system\n"
	       "error (one line on stderr), 2 bad command line.\n",
	       GPFIFO_ENTRIES - 1, (unsigned int)MAX_SYSMEM_MIB);
}

static const char *option_name(int opt)
{
	const struct option *o;

	for (o = long_options; o->name; o++)
		if (o->val == opt)
			return o->name;
	return "?";
}

static unsigned long parse_ulong(int opt, const char *arg, unsigned long min, unsigned long max)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = strtoul(arg, &end, 10);
	if (errno || end == arg || *end || arg[0] == '-' || v < min || v > max)
		usage_error("invalid value for --%s: '%s' (%lu to %lu)", option_name(opt), arg,
			    min, max);
	return v;
}

static double parse_double(int opt, const char *arg, double min, double max)
{
	double v;
	char *end;

	errno = 0;
	v = strtod(arg, &end);
	if (errno || end == arg || *end || !isfinite(v) || v < min || v > max)
		usage_error("invalid value for --%s: '%s'", option_name(opt), arg);
	return v;
}

static void parse_options(struct config *cfg, int argc, char **argv)
{
	int opt;

	while ((opt = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
		switch (opt) {
		case OPT_DEV_DIR:
			if (!*optarg)
				usage_error("invalid value for --dev-dir: ''");
			cfg->dev_dir = optarg;
			break;
		case OPT_GPU:
			cfg->gpu = parse_ulong(opt, optarg, 0, NVRM_MAX_GPU_MINOR);
			break;
		case OPT_SHAPE:
			if (!strcmp(optarg, "saturate"))
				cfg->shape = SHAPE_SATURATE;
			else if (!strcmp(optarg, "requests"))
				cfg->shape = SHAPE_REQUESTS;
			else
				usage_error("invalid value for --shape: '%s' (saturate or requests)",
					    optarg);
			break;
		case OPT_SECONDS:
			cfg->seconds = parse_double(opt, optarg, 0.001, 86400.0 * 365);
			break;
		case OPT_START_AT:
			cfg->start_at = parse_double(opt, optarg, 0, 1e11);
			cfg->has_start_at = true;
			break;
		case OPT_LABEL:
			cfg->label = optarg;
			break;
		case OPT_KERNEL_US:
			cfg->kernel_us = parse_ulong(opt, optarg, 0, MAX_KERNEL_US);
			break;
		case OPT_SYNC_EVERY:
			cfg->sync_every = parse_ulong(opt, optarg, 1, MAX_KERNELS_PER_BATCH);
			break;
		case OPT_QUEUE:
			cfg->queue = parse_ulong(opt, optarg, 1, GPFIFO_ENTRIES - 1);
			break;
		case OPT_RATE_HZ:
			cfg->rate_hz = parse_double(opt, optarg, 0.001, 1e6);
			break;
		case OPT_POISSON:
			cfg->poisson = true;
			break;
		case OPT_KERNELS:
			cfg->kernels = parse_ulong(opt, optarg, 1, MAX_KERNELS_PER_BATCH);
			break;
		case OPT_MEM_MIB:
			cfg->mem_mib = parse_ulong(opt, optarg, 1, MAX_SYSMEM_MIB);
			break;
		case OPT_STEPS:
			cfg->steps = parse_ulong(opt, optarg, 0, 1000000);
			break;
		case OPT_VIDMEM_MIB:
			cfg->vidmem_mib = parse_ulong(opt, optarg, 1, MAX_VIDMEM_MIB);
			break;
		case OPT_VIDMEM_HOLD:
			cfg->vidmem_hold_mib = parse_ulong(opt, optarg, 0, MAX_VIDMEM_MIB);
			break;
		case OPT_NO_FREE:
			cfg->no_free = true;
			break;
		case OPT_TIMELINE:
			cfg->timeline = true;
			break;
		case OPT_TIMEOUT:
			cfg->timeout = parse_double(opt, optarg, 0.001, 86400);
			break;
		case OPT_POLL_US:
			cfg->poll_us = parse_ulong(opt, optarg, 1, 100000);
			break;
		case OPT_SEED:
			cfg->seed = parse_ulong(opt, optarg, 0, ULONG_MAX);
			cfg->has_seed = true;
			break;
		case OPT_USERD:
			if (strcmp(optarg, "rm") && strcmp(optarg, "client"))
				usage_error("invalid value for --userd: '%s' (rm or client)", optarg);
			cfg->userd_client = !strcmp(optarg, "client");
			break;
		case OPT_USERD_OFFSET:
			cfg->userd_offset = parse_ulong(opt, optarg, 0, USERD_MEM_SIZE - NVRM_USERD_SIZE);
			if (cfg->userd_offset % NVRM_USERD_SIZE)
				usage_error("invalid value for --userd-offset: '%s' (a multiple of %u)",
					    optarg, NVRM_USERD_SIZE);
			break;
		case OPT_TREE:
			if (!strcmp(optarg, "simple"))
				cfg->tree = TREE_SIMPLE;
			else if (!strcmp(optarg, "cuda"))
				cfg->tree = TREE_CUDA;
			else
				usage_error("invalid value for --tree: '%s' (simple or cuda)", optarg);
			break;
		case 'h':
			print_help();
			exit(0);
		default:
			/* getopt_long has said what was wrong, on one line. */
			exit(2);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
}

/* The ring, the semaphore and a segment per slot must fit in the system memory object. */
static void check_layout(const struct config *cfg)
{
	size_t need = SEG_OFFSET + (size_t)segment_count(cfg) *
		      seg_stride(kernels_per_batch(cfg));

	_Static_assert(RING_OFFSET + GPFIFO_ENTRIES * NVRM_GP_ENTRY_SIZE <= SEM_OFFSET, "ring");
	if (need > (size_t)cfg->mem_mib << 20)
		usage_error("invalid value for --mem-mib: '%u' (the ring and %u segments of %u "
			    "kernels need %zu bytes)", cfg->mem_mib, segment_count(cfg),
			    kernels_per_batch(cfg), need);
}

static void build_paths(struct gpu *g)
{
	const char *dir = g->cfg->dev_dir;
	size_t len = strlen(dir);
	int n1, n2;

	while (len > 1 && dir[len - 1] == '/')
		len--;
	if (len == 1 && dir[0] == '/')
		len = 0;
	n1 = snprintf(g->ctl_path, sizeof(g->ctl_path), "%.*s/nvidiactl", (int)len, dir);
	n2 = snprintf(g->gpu_path, sizeof(g->gpu_path), "%.*s/nvidia%u", (int)len, dir,
		      g->cfg->gpu);
	if (n1 < 0 || n2 < 0 || (size_t)n1 >= sizeof(g->ctl_path) ||
	    (size_t)n2 >= sizeof(g->gpu_path))
		usage_error("invalid value for --dev-dir: '%s' (too long)", dir);
}

int main(int argc, char **argv)
{
	struct config cfg = {
		.dev_dir = "/dev",
		.shape = SHAPE_SATURATE,
		.seconds = 5,
		.label = "",
		.kernel_us = 500,
		.sync_every = 8,
		.queue = 2,
		.rate_hz = 50,
		.kernels = 1,
		.mem_mib = 2,
		.vidmem_mib = 1,
		.timeout = 30,
		.poll_us = 20,
		.userd_offset = USERD_DEFAULT_OFFSET,
	};
	struct gpu g;
	struct submitter s;
	struct results r;

	parse_options(&cfg, argc, argv);
	check_layout(&cfg);

	memset(&g, 0, sizeof(g));
	g.cfg = &cfg;
	g.next_handle = HANDLE_BASE;
	g.ctl = g.gpu_fd = -1;
	g.usermode_map.fd = g.sysmem_map.fd = g.userd_map.fd = g.usermode2_map.fd = -1;
	build_paths(&g);
	if (cfg.has_seed)
		srand48((long)cfg.seed);
	else
		srand48((long)getpid() ^ (long)now_ns());

	/* From here a signal makes us skip or end the loop, then clean up and report. */
	install_signals();
	setup(&g);
	submitter_init(&s, &g);
	/* For tests and people: the handles an outside controller needs to act on this process. */
	fprintf(stderr, "gpuload: ready pid=%d client=0x%x subdevice=0x%x tsg=0x%x channel=0x%x\n",
		(int)getpid(), g.client, g.subdevice, g.tsg, g.channel);

	memset(&r, 0, sizeof(r));
	if (cfg.has_start_at)
		sleep_until_epoch(cfg.start_at);
	r.t0 = r.end = now_ns();
	if (stop_count)
		r.interrupted = true;
	else if (cfg.shape == SHAPE_SATURATE)
		run_saturate(&s, &cfg, &r);
	else
		run_requests(&s, &cfg, &r);

	drain(&s, &cfg, &r);
	/* Report after the clean-up, so that the ioctl counts include its RM_FREE. */
	teardown(&g);
	print_report(&cfg, &g, &r);
	free(s.submit_ns);
	free(r.lat_ms);
	free(r.done_s);
	return 0;
}
