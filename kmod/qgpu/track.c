// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the RM objects of each cgroup, from the driver's answers.
 *
 * Which cgroup governs what (Kubernetes runs a pod's processes in container scopes below the
 * pod slice that the daemon configures):
 *
 *  - A configured cgroup governs itself and every cgroup below it; the nearest configured
 *    ancestor (or the cgroup itself) wins. Its memory limit, time slices, tenant guard and
 *    statistics apply to all of them. A cgroup with no configured ancestor governs itself.
 *  - A client's origin is the cgroup v2 of the process that allocated it, taken at that
 *    RM_ALLOC (a client from before qgpu was loaded: the process that first uses it). The
 *    client, and everything below it, is charged to the cgroup that governs its origin,
 *    whoever uses the fd later (fd passing moves no charge) and wherever the allocating process
 *    moves afterwards (as memcg keeps charges where they were made). Moving into a child cgroup
 *    changes nothing: the child is governed by the same configured ancestor.
 *  - When the configuration changes (a cgroup configured, unconfigured or reaped), every
 *    client is charged again to the cgroup that governs its origin now, with all it holds
 *    (memory, TSGs, channels); the scheduler and the timeslices follow at their next pass. The
 *    client holds a reference on its origin cgroup, so this works after the origin is removed.
 *  - The tenant guard asks which cgroup governs the calling process at the time of the call.
 *
 * The configured ids are also kept in a sorted array under a seqlock, so the hooks can find the
 * cgroup governing a process without qgpu_lock (qgpu_current_cgroup_id()).
 *
 * Objects are dropped with RM_FREE (with their descendants, as RM frees them, and with the TSGs
 * and channels RM invalidated as the object's dependents, which ioctl.c asks RM about after a
 * free that can have any) and with the file their client lives on. A channel is also on its
 * GPU's list (qgpu_gpu_channels), which the scheduler walks instead of every object. All of it
 * runs under qgpu_lock.
 *
 * What RM says about an object is learnt through the kernel client with no lock held (ioctl.c),
 * so an RM_ALLOC's account and an RM_FREE's of the same client can cross: a free can end at RM
 * after an allocation's query said the object was there, or an object can be made again at a
 * handle after a free's query said it was gone. Every such event takes a number from one
 * counter (qgpu_track_seq()): a client records when an RM_FREE in it last returned (freed) and
 * when RM last confirmed it or an object in it (added), an object when RM last confirmed it.
 * An allocation's account is committed only if no free of its client returned since the query
 * began (qgpu_track_freed_since()), a free's only if RM confirmed nothing it would drop since
 * (qgpu_track_added_since()); otherwise RM is asked again. A free of a client qgpu does not
 * track, or of a whole client, is recorded globally (orphan_freed), as its record may be gone.
 */
#include <linux/cgroup.h>
#include <linux/lockdep.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/seqlock.h>
#include <linux/slab.h>
#include <linux/sort.h>

#include "qgpu.h"

LIST_HEAD(qgpu_cgroups);
unsigned int qgpu_nr_configured;
LIST_HEAD(qgpu_clients);
struct list_head qgpu_gpu_channels[QGPU_MAX_GPUS];
static LIST_HEAD(mappings);

/* Events of RM_ALLOC and RM_FREE accounts (see the header); under qgpu_lock. */
static u64 obj_seq;
static u64 orphan_freed;

/* The configured cgroup ids, sorted: written under qgpu_lock, read by anyone under cfg_seq. */
static DEFINE_SEQLOCK(cfg_seq);
static u64 cfg_ids[QGPU_MAX_CGROUPS];
static unsigned int cfg_n;

/**
 * qgpu_track_init() - set up the per-GPU channel lists
 *
 * Context: module init, before anything is tracked.
 */
void qgpu_track_init(void)
{
	int i;

	for (i = 0; i < QGPU_MAX_GPUS; i++)
		INIT_LIST_HEAD(&qgpu_gpu_channels[i]);
}

/* Under read_seqbegin(&cfg_seq). */
static bool cfg_has(u64 id)
{
	unsigned int lo = 0, hi = cfg_n;

	while (lo < hi) {
		unsigned int mid = lo + (hi - lo) / 2;
		u64 v = READ_ONCE(cfg_ids[mid]);

		if (v == id)
			return true;
		if (v < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/*
 * The id of the nearest configured cgroup at or above @cgrp, else @cgrp's own. @cgrp must stay
 * valid (a reference, or RCU with the task's css_set): its ancestors are pinned by it.
 */
static u64 governing_id(struct cgroup *cgrp)
{
	struct cgroup *c;
	unsigned int seq;
	u64 id;

	do {
		seq = read_seqbegin(&cfg_seq);
		id = cgroup_id(cgrp);
		for (c = cgrp; c; c = cgroup_parent(c)) {
			if (cfg_has(cgroup_id(c))) {
				id = cgroup_id(c);
				break;
			}
		}
	} while (read_seqretry(&cfg_seq, seq));
	return id;
}

/**
 * qgpu_current_cgroup_id() - the cgroup that governs the calling process
 *
 * The nearest configured cgroup at or above the caller's cgroup v2, else the caller's own
 * (see the header of track.c). Takes no qgpu lock, so it may be called with or without
 * qgpu_lock held; a configuration change racing with it gives the answer before or after.
 *
 * Context: process context.
 * Return: a cgroup id.
 */
u64 qgpu_current_cgroup_id(void)
{
	u64 id;

	rcu_read_lock();
	id = governing_id(task_dfl_cgroup(current));
	rcu_read_unlock();
	return id;
}

/**
 * qgpu_cg_get() - the record of one cgroup, by its exact id
 * @id: the cgroup id (no ancestor lookup: qgpu_current_cgroup_id() did that for a caller)
 * @create: make an empty record if there is none
 *
 * Context: qgpu_lock held.
 * Return: the record, valid while qgpu_lock is held; NULL if there is none (or no memory).
 */
struct qgpu_cg *qgpu_cg_get(u64 id, bool create)
{
	struct qgpu_cg *cg;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (cg->id == id)
			return cg;
	if (!create)
		return NULL;
	cg = kzalloc(sizeof(*cg), GFP_KERNEL);
	if (!cg)
		return NULL;
	cg->id = id;
	list_add_tail(&cg->node, &qgpu_cgroups);
	return cg;
}

/**
 * qgpu_cg_put_if_unused() - drop a cgroup's record if it is neither configured nor charged
 * @cg: the record; not to be used after this call
 *
 * Context: qgpu_lock held.
 */
void qgpu_cg_put_if_unused(struct qgpu_cg *cg)
{
	lockdep_assert_held(&qgpu_lock);
	if (cg->configured || cg->clients || cg->mem_used || cg->mem_reserved)
		return;
	list_del(&cg->node);
	kfree(cg);
}

static int cmp_u64(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? -1 : x > y;
}

/* Charge @client, with all it holds, to @to instead. */
static void client_move(struct qgpu_client *client, struct qgpu_cg *to)
{
	struct qgpu_cg *from = client->cg;
	struct qgpu_obj *obj;

	list_for_each_entry(obj, &client->objects, node) {
		qgpu_gate_move(obj, from, to);
		if (obj->kind == QGPU_OBJ_TSG) {
			from->tsgs--;
			to->tsgs++;
		} else if (obj->kind == QGPU_OBJ_CHANNEL) {
			from->channels--;
			to->channels++;
		}
	}
	from->clients--;
	to->clients++;
	client->cg = to;
	qgpu_timeslice_unsure(from);
	qgpu_timeslice_unsure(to);
}

/* The record of the cgroup governing @client's origin now; the current one if unknown. */
static struct qgpu_cg *governing_cg(struct qgpu_client *client, struct qgpu_cg *fallback)
{
	struct qgpu_cg *cg;

	if (!client->origin)
		return fallback;
	cg = qgpu_cg_get(governing_id(client->origin), true);
	return cg ? cg : fallback;
}

/**
 * qgpu_cg_config_changed() - follow a change of which cgroups are configured
 *
 * Rebuilds the configured set the hooks read, charges every client to the cgroup that governs
 * its origin now (see the header), and drops the records left unused. A caller's pointers to
 * unconfigured records may be stale afterwards.
 *
 * Context: qgpu_lock held, after setting or clearing a record's configured flag.
 */
void qgpu_cg_config_changed(void)
{
	struct qgpu_client *client;
	struct qgpu_cg *cg, *tmp;
	unsigned int n = 0;

	lockdep_assert_held(&qgpu_lock);
	write_seqlock(&cfg_seq);
	list_for_each_entry(cg, &qgpu_cgroups, node)
		if (cg->configured && n < ARRAY_SIZE(cfg_ids))
			cfg_ids[n++] = cg->id;
	sort(cfg_ids, n, sizeof(cfg_ids[0]), cmp_u64, NULL);
	cfg_n = n;
	write_sequnlock(&cfg_seq);

	list_for_each_entry(client, &qgpu_clients, node) {
		cg = governing_cg(client, client->cg);
		if (cg != client->cg)
			client_move(client, cg);
	}
	list_for_each_entry_safe(cg, tmp, &qgpu_cgroups, node)
		qgpu_cg_put_if_unused(cg);
}

/**
 * qgpu_client_find() - a tracked RM client
 * @handle: its handle
 *
 * Context: qgpu_lock held.
 * Return: the client, valid while qgpu_lock is held; NULL if it is not tracked.
 */
struct qgpu_client *qgpu_client_find(u32 handle)
{
	struct qgpu_client *client;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(client, &qgpu_clients, node)
		if (client->handle == handle)
			return client;
	return NULL;
}

/**
 * qgpu_obj_find() - a tracked object of a client
 * @client: the client
 * @handle: the object's handle
 *
 * Context: qgpu_lock held.
 * Return: the object, valid while qgpu_lock is held; NULL if it is not tracked.
 */
struct qgpu_obj *qgpu_obj_find(struct qgpu_client *client, u32 handle)
{
	struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(obj, &client->objects, node)
		if (obj->handle == handle)
			return obj;
	return NULL;
}

/**
 * qgpu_client_subdevice() - a client's subdevice on a GPU
 * @client: the client
 * @gpu: the GPU
 *
 * GR controls on the client's channels and TSGs go to it: RM finds the channel or TSG they name
 * in the subdevice's client.
 *
 * Context: qgpu_lock held.
 * Return: its handle; 0 if the client has none tracked on @gpu.
 */
u32 qgpu_client_subdevice(const struct qgpu_client *client, int gpu)
{
	const struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(obj, &client->objects, node)
		if (obj->kind == QGPU_OBJ_SUBDEVICE && obj->gpu == gpu)
			return obj->handle;
	return 0;
}

/**
 * qgpu_tsg_compute_channel() - the channel of a TSG that holds a compute object
 * @client: the TSG's client
 * @tsg: the TSG
 *
 * The channel a GR control names the TSG's context by. CUDA's context has eight; the mode set
 * through any one of them is the context's (an H200: tools/gpu/preemption_modes.py, call 32A).
 *
 * Context: qgpu_lock held.
 * Return: its handle; 0 if none is tracked.
 */
u32 qgpu_tsg_compute_channel(struct qgpu_client *client, const struct qgpu_obj *tsg)
{
	const struct qgpu_obj *obj, *channel;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(obj, &client->objects, node) {
		if (obj->kind != QGPU_OBJ_COMPUTE)
			continue;
		channel = qgpu_obj_find(client, obj->parent);
		if (channel && channel->kind == QGPU_OBJ_CHANNEL && channel->parent == tsg->handle)
			return channel->handle;
	}
	return 0;
}

static bool is_client_class(u32 hclass)
{
	return hclass == NV01_ROOT || hclass == NV01_ROOT_NON_PRIV || hclass == NV01_ROOT_CLIENT;
}

/*
 * The compute engine classes, VOLTA_COMPUTE_A (0xc3c0) to BLACKWELL_COMPUTE_B (0xcec0): the
 * class headers clc3c0.h to clcec0.h of open-gpu-kernel-modules 580.142, the same span as the
 * channel classes (qgpu_channel_class()). CUDA allocates one on each channel of its compute TSG
 * (the shipped H200 trace: 8 channels of one TSG of four).
 */
static bool compute_class(u32 hclass)
{
	return (hclass & 0xff) == 0xc0 && hclass >= 0xc3c0 && hclass <= 0xcfc0;
}

static enum qgpu_obj_kind kind_of(u32 hclass)
{
	if (compute_class(hclass))
		return QGPU_OBJ_COMPUTE;
	switch (hclass) {
	case NV01_DEVICE_0:
		return QGPU_OBJ_DEVICE;
	case NV20_SUBDEVICE_0:
		return QGPU_OBJ_SUBDEVICE;
	case KEPLER_CHANNEL_GROUP_A:
		return QGPU_OBJ_TSG;
	case NV01_MEMORY_LOCAL_USER:
		return QGPU_OBJ_VIDMEM;
	}
	if (qgpu_channel_class(hclass))
		return QGPU_OBJ_CHANNEL;
	return QGPU_OBJ_OTHER;
}

/*
 * Whether @task belongs to NVIDIA's MPS server, whose clients' kernels run in its context
 * (timeslice.c). Its executable, nvidia-cuda-mps-server, is the process's name cut to
 * TASK_COMM_LEN - 1 characters, as is the control daemon's: that one holds no TSG. A tenant that
 * names itself so only makes its own cgroup's processes count as one context.
 */
static bool is_mps_server(struct task_struct *task)
{
	char comm[TASK_COMM_LEN];

	get_task_comm(comm, task->group_leader);
	return !strcmp(comm, "nvidia-cuda-mps");
}

static struct qgpu_client *client_new(struct qgpu_cg *cg, struct file *file, u32 handle)
{
	struct qgpu_client *client = kzalloc(sizeof(*client), GFP_KERNEL);
	struct cgroup *origin;

	if (!client)
		return NULL;
	/* The allocating process's own cgroup: pinned, so its ancestors stay walkable. */
	rcu_read_lock();
	origin = task_dfl_cgroup(current);
	if (!cgroup_tryget(origin))
		origin = NULL;
	rcu_read_unlock();
	client->handle = handle;
	client->file = file;
	client->origin = origin;
	client->tgid = task_tgid_nr(current);
	client->mps_server = is_mps_server(current);
	client->cg = governing_cg(client, cg);
	INIT_LIST_HEAD(&client->objects);
	list_add_tail(&client->node, &qgpu_clients);
	client->cg->clients++;
	client->added = ++obj_seq;
	return client;
}

/**
 * qgpu_track_alloc() - record what a successful RM_ALLOC made
 * @cg: the cgroup of a new client (the owner of @hclient's client, if tracked, keeps it)
 * @file: the file it was allocated through
 * @hclient: the client (hRoot)
 * @hparent: its parent
 * @hnew: its handle, as RM answered it
 * @hclass: its class
 * @device_index: for a device, the GPU it names
 *
 * Device memory is charged by the caller, on the object returned (gate.c).
 *
 * Context: qgpu_lock held.
 * Return: the object recorded, valid while qgpu_lock is held; NULL for a client or when there
 * was no memory for the record.
 */
struct qgpu_obj *qgpu_track_alloc(struct qgpu_cg *cg, struct file *file, u32 hclient,
				  u32 hparent, u32 hnew, u32 hclass, u32 device_index)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj, *parent;

	lockdep_assert_held(&qgpu_lock);
	if (is_client_class(hclass)) {
		if (!qgpu_client_find(hnew))
			client_new(cg, file, hnew);
		return NULL;
	}
	client = qgpu_client_find(hclient);
	/* A client from before qgpu was loaded: adopted by the cgroup that uses it now. */
	if (!client)
		client = client_new(cg, file, hclient);
	obj = client ? kzalloc(sizeof(*obj), GFP_KERNEL) : NULL;
	if (!obj)
		return NULL;
	obj->handle = hnew;
	obj->parent = hparent;
	obj->kind = kind_of(hclass);
	obj->depended_on = hclass == FERMI_VASPACE_A || hclass == FERMI_CONTEXT_SHARE_A;
	obj->enabled = true;
	obj->client = client;
	obj->seq = ++obj_seq;
	client->added = obj->seq;
	INIT_LIST_HEAD(&obj->gpu_node);
	parent = qgpu_obj_find(client, hparent);
	obj->gpu = obj->kind == QGPU_OBJ_DEVICE ? (int)device_index : parent ? parent->gpu : -1;
	list_add_tail(&obj->node, &client->objects);
	/* Its channel's TSG is a CUDA context (timeslice.c counts them) while the TSG lives. */
	if (obj->kind == QGPU_OBJ_COMPUTE && parent && parent->kind == QGPU_OBJ_CHANNEL) {
		struct qgpu_obj *tsg = qgpu_obj_find(client, parent->parent);

		if (tsg && tsg->kind == QGPU_OBJ_TSG)
			tsg->computes = true;
	}
	/*
	 * A TSG or compute object: until the timeslice pass it kicks has looked (ioctl.c). A
	 * channel changes nothing in a TSG that holds qgpu's value, and is not preempted outside
	 * one; no pass would find otherwise.
	 */
	if (obj->kind == QGPU_OBJ_TSG || obj->kind == QGPU_OBJ_COMPUTE ||
	    (obj->kind == QGPU_OBJ_CHANNEL &&
	     !(parent && parent->kind == QGPU_OBJ_TSG && parent->ts_set)))
		qgpu_timeslice_unsure(client->cg);
	if (obj->kind == QGPU_OBJ_TSG) {
		client->cg->tsgs++;
	} else if (obj->kind == QGPU_OBJ_CHANNEL) {
		client->cg->channels++;
		/* Its GPU's run queue: the scheduler walks only these. */
		if (obj->gpu >= 0 && obj->gpu < QGPU_MAX_GPUS)
			list_add_tail(&obj->gpu_node, &qgpu_gpu_channels[obj->gpu]);
	}
	return obj;
}

static void obj_drop(struct qgpu_client *client, struct qgpu_obj *obj)
{
	struct qgpu_cg *cg = client->cg;

	qgpu_gate_put(obj);
	if (obj->kind == QGPU_OBJ_TSG) {
		cg->tsgs--;
		/* One process fewer may leave one: its TSGs get the class's value (timeslice.c). */
		if (cg->configured)
			qgpu_timeslice_tsg_dropped();
	} else if (obj->kind == QGPU_OBJ_CHANNEL) {
		cg->channels--;
	}
	qgpu_userd_obj_drop(client->handle, obj);
	list_del(&obj->node);
	list_del_init(&obj->gpu_node);
	/* A scheduler is changing it in RM right now: that scheduler frees it (sched.c). */
	if (obj->in_change) {
		obj->dead = true;
		obj->client = NULL;
		return;
	}
	kfree(obj);
}

/*
 * RM frees an object's descendants with it. Every pass drops at least one object, so this ends;
 * the depth is a handful in practice (device, TSG, channel) and bounded here.
 */
static void subtree_drop(struct qgpu_client *client, u32 handle, int depth)
{
	struct qgpu_obj *obj;
	bool again = depth < 16;

	while (again) {
		again = false;
		list_for_each_entry(obj, &client->objects, node) {
			if (obj->parent == handle && obj->handle != handle) {
				subtree_drop(client, obj->handle, depth + 1);
				again = true;
				break;
			}
		}
	}
	obj = qgpu_obj_find(client, handle);
	if (obj)
		obj_drop(client, obj);
}

static void client_drop(struct qgpu_client *client)
{
	struct qgpu_cg *cg = client->cg;
	struct qgpu_obj *obj, *tmp;

	list_for_each_entry_safe(obj, tmp, &client->objects, node)
		obj_drop(client, obj);
	qgpu_userd_forget(client->handle, 0);
	list_del(&client->node);
	if (client->origin)
		cgroup_put(client->origin);
	kfree(client);
	cg->clients--;
	qgpu_cg_put_if_unused(cg);
}

/**
 * qgpu_track_free() - forget what a successful RM_FREE freed
 * @hclient: the client (hRoot)
 * @hobject: the object freed, with its descendants; the client itself (or 0) frees it all
 *
 * Context: qgpu_lock held.
 */
void qgpu_track_free(u32 hclient, u32 hobject)
{
	struct qgpu_client *client;

	lockdep_assert_held(&qgpu_lock);
	client = qgpu_client_find(hclient);
	if (!client)
		return;
	if (hobject == hclient || hobject == 0)
		client_drop(client);
	else
		subtree_drop(client, hobject, 0);
}

/**
 * qgpu_track_seq() - the number of the latest allocation or free event (see the header)
 *
 * Taken before a query of RM, to tell afterwards whether anything crossed it.
 *
 * Context: qgpu_lock held.
 * Return: the counter's value.
 */
u64 qgpu_track_seq(void)
{
	lockdep_assert_held(&qgpu_lock);
	return obj_seq;
}

/**
 * qgpu_track_freeing() - note that an RM_FREE in @hclient returned from the driver
 * @file: the file it was sent through
 * @hclient: the client it named
 * @whole: it named the client itself
 *
 * An allocation in @hclient whose query began before this will ask RM again. A free naming a
 * client tracked on another file is not noted: RM refuses it (rmclientValidate), and qgpu
 * untracks nothing for it either, so it cannot make another tenant's accounts ask again.
 *
 * Context: qgpu_lock held.
 * Return: the event's number.
 */
u64 qgpu_track_freeing(struct file *file, u32 hclient, bool whole)
{
	struct qgpu_client *client;

	lockdep_assert_held(&qgpu_lock);
	client = qgpu_client_find(hclient);
	if (client && client->file != file)
		return obj_seq;
	++obj_seq;
	if (client)
		client->freed = obj_seq;
	if (!client || whole)
		orphan_freed = obj_seq;
	return obj_seq;
}

/**
 * qgpu_track_freed_since() - whether an RM_FREE in @hclient returned after event @seq
 * @hclient: the client an allocation's account is about
 * @seq: qgpu_track_seq() before the query of RM
 *
 * Context: qgpu_lock held.
 * Return: true if the account may be stale: RM is to be asked again.
 */
bool qgpu_track_freed_since(u32 hclient, u64 seq)
{
	struct qgpu_client *client;

	lockdep_assert_held(&qgpu_lock);
	client = qgpu_client_find(hclient);
	return client ? client->freed > seq : orphan_freed > seq;
}

/**
 * qgpu_track_added_since() - whether RM confirmed, after event @seq, what a free would drop
 * @hclient: the client a free's account is about
 * @hobject: the object freed; the client itself or 0 for the whole client
 * @seq: qgpu_track_seq() before the query of RM
 *
 * Context: qgpu_lock held.
 * Return: true if the account may be stale: RM is to be asked again.
 */
bool qgpu_track_added_since(u32 hclient, u32 hobject, u64 seq)
{
	struct qgpu_client *client;
	struct qgpu_obj *obj;

	lockdep_assert_held(&qgpu_lock);
	client = qgpu_client_find(hclient);
	if (!client)
		return false;
	if (hobject == hclient || !hobject)
		return client->added > seq;
	obj = qgpu_obj_find(client, hobject);
	return obj && obj->seq > seq;
}

/**
 * qgpu_track_confirmed() - note that RM confirmed a tracked client or object again
 * @client: the client
 * @obj: the object, or NULL for the client itself
 *
 * Context: qgpu_lock held.
 */
void qgpu_track_confirmed(struct qgpu_client *client, struct qgpu_obj *obj)
{
	lockdep_assert_held(&qgpu_lock);
	client->added = ++obj_seq;
	if (obj)
		obj->seq = obj_seq;
}

/**
 * qgpu_track_agrees() - whether a tracked object is what RM now has at its handle
 * @obj: the tracked object
 * @hparent: the parent RM reports
 * @hclass: the class RM reports
 * @bytes: device memory: the size RM reports; 0 when RM did not say
 *
 * A handle can be freed and made again between RM's answer and qgpu's account of it: a record
 * that disagrees with RM is of the old object, and is to be dropped (with what is below it).
 *
 * Context: qgpu_lock held.
 * Return: true if the record agrees with RM's answer.
 */
bool qgpu_track_agrees(struct qgpu_obj *obj, u32 hparent, u32 hclass, u64 bytes)
{
	lockdep_assert_held(&qgpu_lock);
	return obj->kind == kind_of(hclass) && obj->parent == hparent &&
	       (!bytes || qgpu_gate_bytes(obj) == bytes);
}

/**
 * qgpu_track_file_released() - forget the clients and mapping contexts of a closed file
 * @file: the file the driver has released
 *
 * Context: qgpu_lock held.
 */
void qgpu_track_file_released(struct file *file)
{
	struct qgpu_client *client, *ctmp;
	struct qgpu_mapping *m, *mtmp;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry_safe(client, ctmp, &qgpu_clients, node) {
		if (client->file == file) {
			client_drop(client);
			/* An account of it in flight through another file asks RM again. */
			orphan_freed = ++obj_seq;
		}
	}
	list_for_each_entry_safe(m, mtmp, &mappings, node) {
		if (m->file == file) {
			list_del(&m->node);
			kfree(m);
		}
	}
}

/**
 * qgpu_track_mapping() - note what the next mmap of a file maps (RM_MAP_MEMORY succeeded)
 * @file: the file RM_MAP_MEMORY named
 * @p: the RM_MAP_MEMORY answer (client, object, offset, address)
 *
 * Context: qgpu_lock held.
 */
void qgpu_track_mapping(struct file *file, const struct nvos33_params_with_fd *p)
{
	struct qgpu_mapping *m;

	lockdep_assert_held(&qgpu_lock);
	m = qgpu_mapping_of(file);
	if (!m) {
		m = kzalloc(sizeof(*m), GFP_KERNEL);
		if (!m)
			return;
		m->file = file;
		list_add_tail(&m->node, &mappings);
	}
	m->client = p->hClient;
	m->object = p->hMemory;
	m->offset = p->offset;
	m->linear = p->pLinearAddress;
}

/**
 * qgpu_mapping_of() - the mapping context of a file
 * @file: the file
 *
 * Context: qgpu_lock held.
 * Return: the context, valid while qgpu_lock is held; NULL if there is none.
 */
struct qgpu_mapping *qgpu_mapping_of(struct file *file)
{
	struct qgpu_mapping *m;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(m, &mappings, node)
		if (m->file == file)
			return m;
	return NULL;
}

/**
 * qgpu_track_exit() - forget everything tracked (module exit, after the schedulers stopped)
 *
 * Context: no one else can reach the tracker any more; takes qgpu_lock for lockdep's sake.
 */
void qgpu_track_exit(void)
{
	struct qgpu_client *client, *ctmp;
	struct qgpu_mapping *m, *mtmp;
	struct qgpu_cg *cg, *cgtmp;

	mutex_lock(&qgpu_lock);
	list_for_each_entry_safe(client, ctmp, &qgpu_clients, node)
		client_drop(client);
	qgpu_userd_exit();
	list_for_each_entry_safe(m, mtmp, &mappings, node) {
		list_del(&m->node);
		kfree(m);
	}
	list_for_each_entry_safe(cg, cgtmp, &qgpu_cgroups, node) {
		list_del(&cg->node);
		kfree(cg);
	}
	qgpu_nr_configured = 0;
	write_seqlock(&cfg_seq);
	cfg_n = 0;
	write_sequnlock(&cfg_seq);
	mutex_unlock(&qgpu_lock);
}

/*
 * The controls by which a tenant could steer how its own work is scheduled, and so undo or
 * outrun qgpu's slices (numbers: 580.142's src/common/sdk/nvidia/inc/ctrl/ctrla06c.h,
 * ctrla06f/ctrla06fgpfifo.h, ctrl2080/ctrl2080fifo.h, ctrl2080/ctrl2080gr.h). The tenant guard
 * decides what becomes of them (tenant_verdict() in ioctl.c).
 */

/**
 * qgpu_scheduling_control() - whether an RM control lets a tenant steer its own scheduling
 * @cmd: the control command
 *
 * Return: true for the controls listed above.
 */
bool qgpu_scheduling_control(u32 cmd)
{
	switch (cmd) {
	case NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
	case NVA06C_CTRL_CMD_SET_TIMESLICE:
	case NVA06C_CTRL_CMD_PREEMPT:
	case NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL:
	case NVA06C_CTRL_CMD_MAKE_REALTIME:		/* first on the runlist, others CTA */
	case NVA06F_CTRL_CMD_GPFIFO_SCHEDULE:
	case NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL:	/* the TSG's level, through a channel */
	case NVA06F_CTRL_CMD_RESTART_RUNLIST:		/* ends the running timeslice */
	case NVA06F_CTRL_CMD_STOP_CHANNEL:		/* off the runlist, behind qgpu's back */
	case NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS:
	case NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY:	/* the whole runlist's policy */
	case NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE:	/* how far a context runs on */
		return true;
	}
	return false;
}
