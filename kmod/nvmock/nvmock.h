/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nvmock: a mock NVIDIA GPU driver that speaks the real RM ABI on the real device numbers, with
 * a simulated engine per GPU. It exists so that qgpu.ko can be developed and tested in a VM and
 * then run unchanged against nvidia.ko.
 *
 * Locking: nvmock_lock (a mutex, like RM's API lock) guards clients, objects, files' mapping
 * contexts and memory accounting. Each engine's spinlock guards what its thread reads while it
 * runs: the runlist, channel and TSG run state, the GPU address map, statistics. The engine lock
 * is only ever taken inside nvmock_lock or alone, never the other way round.
 */
#ifndef _NVMOCK_H
#define _NVMOCK_H

#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/wait.h>
#include <linux/xarray.h>

#include "../uapi/nvrm.h"
#include "../uapi/nvmock.h"

#define NVMOCK_MAX_GPUS		8
#define NVMOCK_MAX_PROCESSES	64

extern struct mutex nvmock_lock;
extern const struct file_operations nvmock_fops;
extern unsigned int nvmock_num_gpus;

/*
 * Backing of a memory object, shared with the mappings of it: system RAM (vmalloc), or for video
 * memory a piece of the BAR1 aperture (bar1.c), I/O memory with no struct page.
 */
struct nvmock_buf {
	struct kref ref;
	void *vaddr;
	size_t size;
	bool bar1;
	phys_addr_t phys;	/* bar1: where it is on the bus */
};

enum nvmock_kind {
	NVMOCK_CLIENT,
	NVMOCK_DEVICE,
	NVMOCK_SUBDEVICE,
	NVMOCK_USERMODE,
	NVMOCK_VASPACE,
	NVMOCK_CTXSHARE,
	NVMOCK_TSG,
	NVMOCK_CHANNEL,
	NVMOCK_COMPUTE,
	NVMOCK_COPY,
	NVMOCK_SYSMEM,
	NVMOCK_VIDMEM,
	NVMOCK_GRCTX,		/* a TSG's graphics context: RM makes one with each TSG (rm.c) */
	NVMOCK_INVALID,		/* invalidated: its resource gone, its handle kept (rm.c) */
	NVMOCK_KINDS,
};

struct nvmock_gpu;
struct nvmock_client;

struct nvmock_mem {
	u32 refs;		/* objects that share it: the allocation and its duplicates */
	u64 size;
	u64 va;			/* GPU address */
	struct nvmock_buf *buf;	/* NULL until first mapped */
	struct list_head va_node;	/* gpu->va_list by address, under the engine lock */
};

struct nvmock_tsg {
	struct nvmock_gpu *gpu;
	u32 id;
	pid_t tgid;
	u64 timeslice_us;
	u32 interleave;
	u32 compute_preemption;	/* its context's: NV2080_CTXSW_PREEMPTION_COMPUTE_* (control.c) */
	u32 engine_type;	/* NV2080_ENGINE_TYPE_* it was made for: its channels' engine */
	u64 subctx_ids;		/* the subcontexts (VEIDs) its context shares hold (rm.c) */
	u32 subctx_max;		/* how many there are: 64, or 2 in legacy mode */
	u32 nr_channels;
	bool legacy;		/* its channels name no context share: RM made two (rm.c) */
	u32 legacy_share[2];	/* their handles, SYNC and ASYNC, in the TSG's client */
	u32 grctx;		/* its graphics context's handle, in the TSG's client */
	bool gr_ctx;		/* its GR context has its main buffer: a compute object came */
	bool gone;
	u64 gpu_ns;
	s64 overrun_ns;		/* how far its last slice ran past the timeslice */
	/* GR_GET_CTXSW_STATS: its context's saves by kind and restores (engine.c) */
	u32 saves, wfi_saves, cilp_saves, restores;
	bool saved;		/* its context is off the engine, to be restored */
	struct list_head channels;
	struct list_head runlist_node;
	struct nvmock_channel *next_channel;	/* round robin inside the TSG */
};

struct nvmock_channel {
	struct nvmock_gpu *gpu;
	struct nvmock_tsg *tsg;
	bool own_tsg;		/* allocated under the device: a TSG of its own */
	u32 chid;
	u64 gpfifo_va;
	u32 entries;
	/* USERD: a page of its own, or a place in a memory object of the client's. */
	struct page *userd_page;
	struct nvmock_buf *userd_buf;
	u32 *userd;
	bool scheduled;		/* GPFIFO_SCHEDULE(bEnable=1), or not delayed at allocation */
	u32 disables;		/* closes not yet undone by an open: GSP counts them */
	u32 disables_max;	/* the most there ever were: a caller that closed twice */
	bool finish_slice;	/* disabled with bOnlyDisableScheduling while on the engine */
	bool stalled;		/* such a close left entries unfetched: opens do not wake it */
	bool faulted;
	bool gone;
	u32 gp_get;
	/* The pushbuffer segment being run and where in it. */
	u64 seg_va;
	u32 seg_words;
	u32 seg_pos;
	bool in_segment;
	u64 run_left_ns;
	u64 ahead_ns;		/* engine time already spent past the last kernel's end */
	u64 sem_va;
	u64 gpu_ns;
	struct list_head tsg_node;
};

struct nvmock_object {
	u32 handle;
	u32 hclass;
	enum nvmock_kind kind;
	struct nvmock_client *client;
	struct nvmock_object *parent;
	struct list_head children;
	struct list_head sibling;
	struct nvmock_gpu *gpu;
	/* The objects it depends on besides its parent: freed with them (RM's refAddDependant). */
	struct nvmock_object *dep[2];
	union {
		struct nvmock_tsg *tsg;
		struct nvmock_channel *channel;
		struct nvmock_mem *mem;
		u32 subdevice_instance;
		u32 subctx_id;		/* a context share's VEID in its TSG */
		u32 engine_type;	/* a compute or copy object's NV2080_ENGINE_TYPE_* */
	};
};

struct nvmock_client {
	u32 handle;
	struct file *owner;	/* the file it was allocated through; NULL for kernel clients */
	pid_t tgid;
	struct xarray objects;
	struct nvmock_object root;
	u32 next_handle;
	struct list_head node;
};

/* What a file's mmap maps: set by RM_MAP_MEMORY naming the file. */
struct nvmock_map_ctx {
	bool set;
	enum nvmock_kind kind;
	struct nvmock_buf *buf;
	struct page *page;	/* USERD or the usermode window's page */
	u64 offset;
	u64 length;
};

struct nvmock_file {
	struct nvmock_gpu *gpu;	/* NULL on /dev/nvidiactl */
	struct file *ctl;	/* REGISTER_FD: the control file this GPU file acts for */
	bool attached;		/* ATTACH_GPUS_TO_FD is allowed once */
	bool sys_params_set;
	struct nvmock_map_ctx map;
	/*
	 * export.c: what was exported to this control file, as nv_file_private_t keeps it
	 * (handles, maxHandles, deviceInstance, metadata): export_max slots of handles in RM's
	 * export client (0: an empty slot); export_handles NULL: the fd holds no export.
	 */
	u32 *export_handles;
	u16 export_max;
	u32 export_instance;
	u8 export_metadata[NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE];
};

struct nvmock_process {
	pid_t tgid;
	u64 gpu_ns;
};

#define NVMOCK_SWITCH_OVER_BINS	4

struct nvmock_engine {
	spinlock_t lock;		/* what the engine thread reads; see the top */
	struct list_head runlist;	/* TSGs */
	struct nvmock_tsg *last;	/* who ran last: round robin and switch cost */
	struct nvmock_tsg *pinned;	/* being switched to or run, partly outside the lock */
	struct nvmock_channel *running;	/* executing outside the lock */
	wait_queue_head_t released;	/* a freer waits here for running to change */
	struct task_struct *thread;
	u64 switches;
	u64 switch_ns;
	/* switches by overshoot past switch_us: under 10 us, 100 us, 1 ms, more */
	u64 switch_over[NVMOCK_SWITCH_OVER_BINS];
	u64 busy_ns;
	struct nvmock_process processes[NVMOCK_MAX_PROCESSES];
};

struct nvmock_gpu {
	unsigned int index;
	u32 gpu_id;
	u64 fb_size;
	u64 fb_used;
	u64 fb_peak;			/* fb_used's most since load or the last reset */
	struct list_head va_list;
	struct page *usermode_page;
	struct ida chids;
	struct ida tsg_ids;
	struct nvmock_engine engine;
	struct dentry *debugfs;
};

extern struct nvmock_gpu nvmock_gpus[NVMOCK_MAX_GPUS];

/* Object counts, for leak checks (debugfs "objects"). */
extern atomic_t nvmock_counts[NVMOCK_KINDS];
extern atomic_t nvmock_buffers;
extern atomic_t nvmock_vmas;
extern atomic_t nvmock_uvm_ranges;

/* uvm.c: /dev/nvidia-uvm. */
int nvmock_uvm_init(void);
void nvmock_uvm_exit(void);

/* rm.c: the object tree. */
struct nvmock_caller {
	struct file *file;	/* the control file the call came through; NULL for the kernel */
	bool kernel;
};

u32 nvmock_rm_alloc(const struct nvmock_caller *caller, u32 hroot, u32 hparent, u32 *hnew,
		    u32 hclass, const void __user *uparams, const void *kparams);
u32 nvmock_rm_free(const struct nvmock_caller *caller, u32 hroot, u32 hparent, u32 hold);
u32 nvmock_rm_dup(const struct nvmock_caller *caller, u32 hclient, u32 hparent, u32 *hobject,
		  u32 hclient_src, u32 hobject_src);
void nvmock_free_clients_of(struct file *file);
struct nvmock_client *nvmock_client_get(u32 handle);
struct nvmock_object *nvmock_object_get(struct nvmock_client *client, u32 handle);
u32 nvmock_heap_info(const struct nvmock_caller *caller, u32 hroot, u32 hparent, u64 *total,
		     u64 *free);
u32 nvmock_caller_client(const struct nvmock_caller *caller, u32 hclient,
			 struct nvmock_client **client);
const char *nvmock_kind_name(enum nvmock_kind kind);
enum nvmock_kind nvmock_class_kind(u32 hclass);

/* control.c */
u32 nvmock_rm_control(const struct nvmock_caller *caller, struct nvos54_params *p,
		      bool kernel_params);

/* export.c */
u32 nvmock_export_to_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
			void *params);
u32 nvmock_import_from_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
			  void *params);
u32 nvmock_export_objects_to_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
				void *params);
u32 nvmock_import_objects_from_fd(const struct nvmock_caller *caller, struct nvmock_object *obj,
				  void *params);
void nvmock_export_release(struct nvmock_file *nf);
long nvmock_export_dmabuf(struct file *file, void *arg, u32 size);
u32 nvmock_fabric_alloc(const struct nvmock_caller *caller, u32 hroot, u32 hparent,
			bool have_params);

/* mmap.c */
struct nvmock_buf *nvmock_buf_alloc(size_t size);
struct nvmock_buf *nvmock_buf_alloc_vidmem(size_t size);
u32 nvmock_mem_back(struct nvmock_object *mem_obj);
void nvmock_buf_put(struct nvmock_buf *buf);
u32 nvmock_map_memory(struct file *ctl, struct nvos33_params_with_fd *p);
void nvmock_map_release(struct nvmock_file *nf);
int nvmock_mmap(struct file *file, struct vm_area_struct *vma);

/* ioctl.c */
long nvmock_ioctl(struct file *file, unsigned int cmd, unsigned long arg);
long rm_ioctl(void *sp, void *nv, struct file *nvfp, u32 cmd, void *data, u32 size);

/* Whether @ch is enabled: no FIFO_DISABLE_CHANNELS or STOP_CHANNEL close outstanding. */
static inline bool nvmock_channel_enabled(const struct nvmock_channel *ch)
{
	return !ch->disables;
}

/* engine.c */
int nvmock_engine_start(struct nvmock_gpu *gpu);
bool nvmock_channel_queued(const struct nvmock_channel *ch);
void nvmock_engine_stop(struct nvmock_gpu *gpu);
void nvmock_engine_add_tsg(struct nvmock_tsg *tsg);
void nvmock_engine_remove_tsg(struct nvmock_tsg *tsg);
void nvmock_engine_add_channel(struct nvmock_channel *ch);
void nvmock_engine_remove_channel(struct nvmock_channel *ch);
bool nvmock_engine_add_mem(struct nvmock_gpu *gpu, struct nvmock_mem *mem);
void nvmock_engine_remove_mem(struct nvmock_gpu *gpu, struct nvmock_mem *mem);
void nvmock_engine_reset_stats(struct nvmock_gpu *gpu);

/* kapi.c: what the in-kernel RM entry served (debugfs "kapi"), under nvmock_lock. */
#define NVMOCK_KAPI_LOG		16

struct nvmock_kapi_record {
	u32 op;
	u32 what;		/* ALLOC: the class; CONTROL: the command; FREE: the handle */
	u64 rights;		/* ALLOC: pRightsRequested as read */
	u32 params_size;	/* ALLOC, CONTROL: paramsSize as read */
	u32 flags;		/* ALLOC, CONTROL: flags as read */
	u32 status;		/* what was written back */
};

struct nvmock_kapi_ring {
	u32 next;
	struct nvmock_kapi_record r[NVMOCK_KAPI_LOG];
};

struct nvmock_kapi_stats {
	u64 allocs, frees, controls;
	u64 failed;		/* of all ops, answered with another status than NV_OK */
	u64 absent;		/* of those, CLIENT_GET_HANDLE_INFO answering "not there" */
	u64 bad_rights;		/* ALLOCs whose pRightsRequested was no kernel address */
	u64 not_modelled;	/* ops the driver runs and nvmock answers NV_ERR_NOT_SUPPORTED */
	u64 unknown;		/* ops the driver does not know: left alone */
	struct nvmock_kapi_ring objects;	/* the latest ops but controls, oldest first */
	struct nvmock_kapi_ring controls_log;	/* the latest controls */
	/* A test's fault: the next kernel ALLOC of this class fails (debugfs "kapi_fail"). */
	bool fail_armed;
	u32 fail_class;
	/*
	 * A test's fault: the next fail_controls kernel CONTROLs of this command fail, carried out
	 * first where fail_acted (GSP answering an error for what it did is not ruled out).
	 */
	u32 fail_controls;
	u32 fail_cmd;
	bool fail_acted;
	/* A test's pose: the version nvidia_get_rm_ops has ("kapi_version"); "": its own. */
	char answer_version[32];
};

extern struct nvmock_kapi_stats nvmock_kapi;

/* bar1.c */
struct seq_file;
int nvmock_bar1_init(void);
void nvmock_bar1_exit(void);
bool nvmock_bar1_present(void);
void *nvmock_bar1_alloc(size_t size, phys_addr_t *phys);
void nvmock_bar1_free(void *vaddr, size_t size);
void nvmock_bar1_show(struct seq_file *m);

/* debugfs.c */
/* A test's delay of one thread group's calls (debugfs slow_calls, slow_kapi). */
struct nvmock_slow {
	atomic_t tgid;			/* a thread group or a thread; 0: nobody */
	atomic_t ms;
};

extern struct nvmock_slow nvmock_slow_calls;
extern struct nvmock_slow nvmock_slow_kapi;
void nvmock_slow_wait(struct nvmock_slow *slow);
void nvmock_debugfs_init(void);
void nvmock_debugfs_exit(void);

/* main.c */
struct nvmock_file *nvmock_file_of(struct file *file);
struct nvmock_file *nv_get_file_private(s32 fd, bool ctl, void **os_private);
void nv_put_file_private(void *os_private);
bool nvmock_process_has_gpu_open(unsigned int index);

#endif /* _NVMOCK_H */
