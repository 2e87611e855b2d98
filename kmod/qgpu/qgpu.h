/* SPDX-License-Identifier: GPL-2.0 */
/*
 * qgpu: time slices, memory limits and a tenant guard for NVIDIA GPUs, per cgroup.
 *
 * Locking: qgpu_lock (a mutex) guards the configuration, the tracked RM objects and the
 * statistics. It is never held while calling into the driver: the driver takes its own lock,
 * and its in-kernel RM entry sleeps. The schedulers read channels' USERD under it, through
 * readers that userd.c drops under it before RM may tear down what they read.
 *
 * No qgpu lock is held across a tenant's call into the driver either, nor across the kernel
 * client's queries that follow it (ioctl.c): device memory is reserved before the call and
 * settled after it (gate.c), and what RM reports is committed under qgpu_lock only if no free
 * in the same client ended between the query and the commit (track.c).
 */
#ifndef _QGPU_H
#define _QGPU_H

#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/types.h>

#include "../uapi/nvrm.h"
#include "../uapi/qgpu.h"

struct cgroup;
struct file;
struct inode;
struct qgpu_client;
struct qgpu_mem;
struct qgpu_userd;
struct vm_area_struct;

extern struct mutex qgpu_lock;
extern char *qgpu_target;
extern unsigned int qgpu_poll_us;

/* A cgroup that has GPU objects or a configuration (or both). */
struct qgpu_cg {
	struct list_head node;		/* qgpu_cgroups */
	u64 id;
	bool configured;
	u32 gpu;
	u8 class;
	u32 share;
	u64 mem_limit;			/* 0: none */

	u64 mem_used;
	u64 mem_reserved;		/* asked for by allocations in flight (gate.c) */
	u32 clients;
	u32 tsgs;
	u32 channels;
	/*
	 * timeslice.c, per pass: a process with TSGs on its GPU, its computing TSGs so far; more
	 * than one CUDA context among them
	 */
	pid_t ts_tgid;
	u32 ts_computing;
	bool ts_several;
	bool ts_mps;		/* an MPS server's client is among them: its clients are none */
	/*
	 * timeslice.c: offline, and every channel of it on its GPU is in a TSG holding the offline
	 * timeslice qgpu set, short enough that the GPU itself switches to online work (sched.c
	 * then leaves it open for online work). Set by a timeslice pass from what RM carried out;
	 * cleared by whatever may end it (qgpu_timeslice_unsure()).
	 */
	bool ts_preempted;

	/* scheduler state, per period (CFS-bandwidth style) */
	bool open;			/* its channels are meant to run now */
	bool busy;			/* work pending at the last look, or held (userd.c) */
	u64 hold_ns;			/* open time it still counts as busy (userd.c) */
	bool moved;			/* this pass: GP_GET moved in a channel read */
	bool moved_in_turn;		/* GP_GET moved since it was last opened */
	bool owed;			/* closed with fetched work maybe unfinished (sched.c) */
	u64 owed_open_ns;		/* open time since it was owed, with nothing moving */
	bool owed_only;			/* busy at this pass only as owed (owed_idle()) */
	bool owed_beside;		/* open beside the holder for owed_ms (owed_again()) */
	u8 owed_every;			/* periods between owed_again()'s, doubling; 0: none yet */
	u8 owed_wait;			/* periods until the next owed_again() */
	bool started;			/* its work was seen on the GPU since it was opened */
	bool closing;			/* RM closed its channels at this pass (sched.c settle()) */
	bool opening;			/* RM opened its channels at this pass (sched.c settle()) */
	ktime_t opened;			/* when it was last opened */
	bool busy_in_period;
	u8 idle_looks;			/* looks in a row it held the GPU with nothing pending */
	bool throttled_in_period;
	s64 slice_ns;			/* what it may still run in this period; < 0: overrun */
	u64 nr_periods;
	u64 nr_throttled;
	u64 throttled_ns;
	u64 open_ns;
	u64 oom;
	u64 denied;
};

enum qgpu_obj_kind {
	QGPU_OBJ_DEVICE,
	QGPU_OBJ_TSG,
	QGPU_OBJ_CHANNEL,
	QGPU_OBJ_VIDMEM,
	QGPU_OBJ_COMPUTE,		/* a compute engine object, on a channel */
	QGPU_OBJ_SUBDEVICE,		/* what GR controls on the client's TSGs go to (sched.c) */
	QGPU_OBJ_OTHER,
};

struct qgpu_obj {
	struct list_head node;		/* client->objects */
	struct list_head gpu_node;	/* channel: qgpu_gpu_channels[gpu] */
	struct qgpu_client *client;	/* its client; NULL once dead */
	u32 handle;
	u32 parent;
	enum qgpu_obj_kind kind;
	int gpu;			/* -1 until known (inherited from the device) */
	struct qgpu_mem *mem;		/* device memory: its charge (gate.c), shared by dups */
	u64 seq;			/* when RM last confirmed it (qgpu_track_seq()) */
	bool enabled;			/* channel: as qgpu last left it (RM's default: on) */
	bool computes;			/* TSG: a compute object is on one of its channels */
	bool depended_on;		/* a VA space or context share (frees_dependents()) */

	/* channel: its USERD and what qgpu makes of it (userd.c) */
	u32 userd_mem;			/* the object it is in; the channel itself when RM's */
	u64 userd_offset;		/* where in that object */
	struct qgpu_userd *userd;	/* how to read it; NULL: qgpu cannot */
	u64 userd_blind;		/* ns: since when qgpu cannot */
	u32 userd_get;			/* GP_GET at the last look */
	u64 userd_seen;			/* ns: a look last showed work, or it became readable */
	u64 userd_next;			/* ns: cold, not read before this; 0: warm */
	u64 userd_born;			/* ns: it last became readable */
	bool userd_used;		/* work seen a second or more after: not dormant */
	/* channel: a scheduler's FIFO_DISABLE_CHANNELS for it is in flight (sched.c) */
	bool in_change;
	bool dead;			/* untracked while in_change: the scheduler frees it */
	u8 ch_failures;			/* RM errors in a row opening or closing it */
	unsigned long ch_retry;		/* jiffies: not before, after an error */

	/* TSG: its timeslice (timeslice.c), in us */
	u64 ts_own;			/* to restore; 0: not known yet */
	u64 ts_set;			/* what qgpu set and has not restored; 0: none */
	bool ts_owed;			/* ts_own was asked for while gated, not carried out */
	u32 ts_gen;			/* bumped when a tenant's request changed RM's value */
	u8 ts_failures;			/* RM errors in a row, of either setting */
	unsigned long ts_retry;		/* jiffies: not before, after an error */
	/* TSG: its context's compute preemption mode (timeslice.c), NV2080_..._COMPUTE_* + 1 */
	u8 pm_own;			/* to restore; 0: not known yet */
	u8 pm_set;			/* what qgpu set and has not restored; 0: none */
	u32 pm_gen;			/* as ts_gen, for the tenant's own mode */
};

struct qgpu_client {
	struct list_head node;		/* qgpu_clients */
	u32 handle;
	struct file *file;		/* the file it was allocated through (not referenced) */
	struct cgroup *origin;		/* the allocating process's cgroup, referenced; or NULL */
	struct qgpu_cg *cg;		/* charged for everything below it: governs origin */
	pid_t tgid;			/* the process that allocated it (timeslice.c) */
	bool mps_server;		/* allocated by NVIDIA's MPS server (timeslice.c) */
	struct list_head objects;
	u64 freed;			/* when an RM_FREE in it last returned (track.c) */
	u64 added;			/* when RM last confirmed it or an object in it */
};

/* Device memory reserved for an allocation in flight (gate.c). */
struct qgpu_resv {
	struct qgpu_cg *cg;		/* NULL: none */
	u64 bytes;
};

/* A mapping context: RM_MAP_MEMORY put (client, object) on a file, mmap will map it. */
struct qgpu_mapping {
	struct list_head node;		/* qgpu_mappings */
	struct file *file;		/* not referenced: dropped when the file is released */
	u32 client;
	u32 object;
	u64 offset;			/* of the object, where the mapping starts */
	u64 linear;			/* RM_MAP_MEMORY's answer */
};

extern struct list_head qgpu_cgroups;
extern struct list_head qgpu_clients;
extern struct list_head qgpu_gpu_channels[QGPU_MAX_GPUS];
extern unsigned int qgpu_nr_configured;

/* hook.c */
int qgpu_hook_init(void);
void qgpu_hook_exit(void);

/*
 * rmprobe.c: the driver's own copy of a request checked against qgpu's, and its answer kept.
 * QGPU_EXPECT_MAX covers NVOS32 up to its ALLOC_SIZE size; QGPU_ANSWER_MAX covers NVOS33 with
 * its fd (and the first fields of NVOS32, through hMemory).
 */
#define QGPU_EXPECT_MAX	96
#define QGPU_ANSWER_MAX	56

enum qgpu_reply {
	QGPU_REPLY_UNKNOWN,	/* no answer kept: read the caller's memory */
	QGPU_REPLY_NONE,	/* RM was not reached */
	QGPU_REPLY_RM,		/* the answer is RM's, from the driver's copy */
};

int qgpu_rmprobe_init(void);
void qgpu_rmprobe_exit(void);
int qgpu_expect(u32 cmd, const void *arg, u32 len, u32 status_off);
enum qgpu_reply qgpu_expect_done(int slot, void *answer, u32 len);
struct file *qgpu_expect_file(int slot);
u64 qgpu_rewrites(u64 *missed);
u64 qgpu_rmprobe_answers_missed(void);
void qgpu_rm_return(void);	/* rmprobe.c's asm: returns to rm_ioctl's caller */
bool qgpu_hooked(void);
bool qgpu_uvm_hooked(void);

/* ioctl.c: the ioctl, mmap and release wrappers' bodies */
long qgpu_ioctl(long (*orig)(struct file *, unsigned int, unsigned long),
		struct file *file, unsigned int cmd, unsigned long arg);
int qgpu_mmap(int (*orig)(struct file *, struct vm_area_struct *),
	      struct file *file, struct vm_area_struct *vma);
int qgpu_release(int (*orig)(struct inode *, struct file *),
		 struct inode *inode, struct file *file);

/* uvm.c: the nvidia-uvm mmap wrapper's body */
int qgpu_uvm_mmap(int (*orig)(struct file *, struct vm_area_struct *), struct file *file,
		  struct vm_area_struct *vma);

/* track.c */
void qgpu_track_init(void);
struct qgpu_cg *qgpu_cg_get(u64 id, bool create);
void qgpu_cg_put_if_unused(struct qgpu_cg *cg);
void qgpu_cg_config_changed(void);
u64 qgpu_current_cgroup_id(void);
struct qgpu_client *qgpu_client_find(u32 handle);
struct qgpu_obj *qgpu_obj_find(struct qgpu_client *client, u32 handle);
u32 qgpu_client_subdevice(const struct qgpu_client *client, int gpu);
u32 qgpu_tsg_compute_channel(struct qgpu_client *client, const struct qgpu_obj *tsg);
struct qgpu_obj *qgpu_track_alloc(struct qgpu_cg *cg, struct file *file, u32 hclient,
				  u32 hparent, u32 hnew, u32 hclass, u32 device_index);
void qgpu_track_free(u32 hclient, u32 hobject);
u64 qgpu_track_seq(void);
u64 qgpu_track_freeing(struct file *file, u32 hclient, bool whole);
bool qgpu_track_freed_since(u32 hclient, u64 seq);
bool qgpu_track_added_since(u32 hclient, u32 hobject, u64 seq);
void qgpu_track_confirmed(struct qgpu_client *client, struct qgpu_obj *obj);
bool qgpu_track_agrees(struct qgpu_obj *obj, u32 hparent, u32 hclass, u64 bytes);
void qgpu_track_file_released(struct file *file);
void qgpu_track_mapping(struct file *file, const struct nvos33_params_with_fd *p);
struct qgpu_mapping *qgpu_mapping_of(struct file *file);
void qgpu_track_exit(void);
bool qgpu_scheduling_control(u32 cmd);

/* userd.c */
bool qgpu_channel_class(u32 hclass);
void qgpu_userd_channel_alloc(u32 hclient, struct qgpu_obj *ch, u32 huserd, u64 offset);
void qgpu_userd_mmap(struct file *file, struct vm_area_struct *vma);
void qgpu_userd_forget(u32 hclient, u32 hobject);
void qgpu_userd_unmap(u32 hclient, u32 hmemory, u64 linear);
void qgpu_userd_file_released(struct file *file);
void qgpu_userd_obj_drop(u32 hclient, struct qgpu_obj *obj);
void qgpu_userd_exit(void);
#define QGPU_LOOK_PENDING	BIT(0)
#define QGPU_LOOK_MOVED		BIT(1)
#define QGPU_LOOK_READ		BIT(2)
unsigned int qgpu_channel_look(const struct qgpu_cg *cg, struct qgpu_obj *ch, u64 now);
bool qgpu_cg_busy(struct qgpu_cg *cg, bool pending, u64 dt);

/* rmapi.c: the driver's in-kernel RM entry */
int qgpu_rmapi_init(void);
void qgpu_rmapi_exit(void);
bool qgpu_rmapi_available(void);
const char *qgpu_rmapi_version(void);
int qgpu_rmapi_gpu_open(u32 gpu, u32 *hclient, u32 *hsubdevice);
void qgpu_rmapi_gpu_close(u32 hclient);
u32 qgpu_rmapi_set_channels(u32 hclient, u32 hsubdevice, bool disable,
			    const u32 *clients, const u32 *channels, u32 n);
u32 qgpu_rmapi_free(u32 hclient, u32 hobject);
u32 qgpu_rmapi_get_timeslice(u32 hclient, u32 htsg, u64 *us);
bool qgpu_rmapi_object_lost(u32 hclient, u32 hobject, bool channel);
u32 qgpu_rmapi_preemption_saves(u32 hclient, u32 hsubdevice, u32 htsg, u32 *saves);
u32 qgpu_rmapi_set_timeslice(u32 hclient, u32 htsg, u64 us);
u32 qgpu_rmapi_get_compute_preemption(u32 hclient, u32 hsubdevice, u32 hchannel, u32 *mode);
u32 qgpu_rmapi_set_compute_preemption(u32 hclient, u32 hsubdevice, u32 hchannel, u32 mode);
u32 qgpu_rmapi_handle_info(u32 hclient, u32 hobject, u32 index, u32 *result);
u32 qgpu_rmapi_mem_size(u32 hclient, u32 hmemory, u64 *bytes);
u32 qgpu_rmapi_objects_are_duplicates(u32 hclient, u32 hobject1, u32 hobject2, bool *dup);

/* gate.c: device memory charges */
bool qgpu_mem_class(u32 hclass);
bool qgpu_gate_limited(u64 id);
void qgpu_gate_refused(u64 id);
bool qgpu_gate_fits(const struct qgpu_cg *cg, u64 bytes);
bool qgpu_gate_reserve(struct qgpu_cg *cg, u64 bytes, struct qgpu_resv *resv);
void qgpu_gate_unreserve(struct qgpu_resv *resv);
int qgpu_gate_charge(struct qgpu_obj *obj, struct qgpu_cg *cg, u64 bytes);
void qgpu_gate_share(struct qgpu_obj *obj, const struct qgpu_obj *orig);
void qgpu_gate_put(struct qgpu_obj *obj);
u64 qgpu_gate_bytes(const struct qgpu_obj *obj);
void qgpu_gate_move(struct qgpu_obj *obj, struct qgpu_cg *from, struct qgpu_cg *to);

/* sched.c */
struct qgpu_gpu_view {
	u8 policy;
	u32 period_us;
	u64 nr_periods;
	u64 switches;
	u64 passes;			/* scheduler passes that looked at channels */
	u64 userd_reads;		/* USERD reads those passes made (userd.c: cold channels) */
	bool online_busy;
	bool running;
	u32 timeslice_us[2];		/* by enum qgpu_class */
	u8 offline_preemption;		/* enum qgpu_preemption */
};

int qgpu_sched_init(void);
void qgpu_sched_exit(void);
int qgpu_sched_set_gpu(u32 gpu, int policy, int period_us);
void qgpu_sched_kick(u32 gpu);
void qgpu_sched_kick_all(void);
void qgpu_sched_view(u32 gpu, struct qgpu_gpu_view *view);
int qgpu_sched_check_shares(u32 gpu, u8 policy, u64 skip_cg, u32 extra_share);

/* timeslice.c */
void qgpu_timeslice_init(void);
void qgpu_timeslice_exit(void);
void qgpu_timeslice_kick(void);
void qgpu_timeslice_tsg_dropped(void);
void qgpu_timeslice_unsure(struct qgpu_cg *cg);
u32 qgpu_timeslice_get(u32 gpu, u8 class);
int qgpu_timeslice_set(u32 gpu, s64 offline_us, s64 online_us);
u8 qgpu_timeslice_preemption(u32 gpu);
int qgpu_timeslice_set_preemption(u32 gpu, u8 preemption);
bool qgpu_timeslice_tenant(struct file *file, u32 hclient, u32 hobject, u64 us,
			   bool carried_out);
bool qgpu_timeslice_tenant_mode(struct file *file, u32 hclient, u32 hchannel, u32 mode);

/* netlink.c */
int qgpu_genl_init(void);
void qgpu_genl_exit(void);
void qgpu_event(u8 event, u64 cgroup_id, u32 gpu);
void qgpu_reap_cgroups(void);
void qgpu_event_counts(u64 *sent, u64 *dropped);

/* sysfs.c */
int qgpu_sysfs_init(void);
void qgpu_sysfs_exit(void);
const char *qgpu_policy_name(u8 policy);

#endif /* _QGPU_H */
