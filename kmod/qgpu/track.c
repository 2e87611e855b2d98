// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: the RM objects of each cgroup, from the driver's answers.
 *
 * A client is charged to the cgroup of the process that allocated it, and so is everything
 * below it, whoever uses the fd later (fd passing moves no charge). Objects are dropped with
 * RM_FREE (with their descendants, as RM frees them) and with the file their client lives on.
 * All of it runs under qgpu_lock.
 */
#include <linux/cgroup.h>
#include <linux/lockdep.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/slab.h>

#include "qgpu.h"

LIST_HEAD(qgpu_cgroups);
unsigned int qgpu_nr_configured;
LIST_HEAD(qgpu_clients);
static LIST_HEAD(mappings);

u64 qgpu_current_cgroup_id(void)
{
	u64 id;

	rcu_read_lock();
	id = cgroup_id(task_dfl_cgroup(current));
	rcu_read_unlock();
	return id;
}

struct qgpu_cg *qgpu_cg_get(u64 id, bool create)
{
	struct qgpu_cg *cg;

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

void qgpu_cg_put_if_unused(struct qgpu_cg *cg)
{
	if (cg->configured || cg->clients || cg->mem_used)
		return;
	list_del(&cg->node);
	kfree(cg);
}

struct qgpu_client *qgpu_client_find(u32 handle)
{
	struct qgpu_client *client;

	list_for_each_entry(client, &qgpu_clients, node)
		if (client->handle == handle)
			return client;
	return NULL;
}

struct qgpu_obj *qgpu_obj_find(struct qgpu_client *client, u32 handle)
{
	struct qgpu_obj *obj;

	list_for_each_entry(obj, &client->objects, node)
		if (obj->handle == handle)
			return obj;
	return NULL;
}

static bool is_client_class(u32 hclass)
{
	return hclass == NV01_ROOT || hclass == NV01_ROOT_NON_PRIV || hclass == NV01_ROOT_CLIENT;
}

static enum qgpu_obj_kind kind_of(u32 hclass)
{
	switch (hclass) {
	case NV01_DEVICE_0:
		return QGPU_OBJ_DEVICE;
	case KEPLER_CHANNEL_GROUP_A:
		return QGPU_OBJ_TSG;
	case NV01_MEMORY_LOCAL_USER:
		return QGPU_OBJ_VIDMEM;
	}
	if (qgpu_channel_class(hclass))
		return QGPU_OBJ_CHANNEL;
	return QGPU_OBJ_OTHER;
}

static struct qgpu_client *client_new(struct qgpu_cg *cg, struct file *file, u32 handle)
{
	struct qgpu_client *client = kzalloc(sizeof(*client), GFP_KERNEL);

	if (!client)
		return NULL;
	client->handle = handle;
	client->file = file;
	client->cg = cg;
	INIT_LIST_HEAD(&client->objects);
	list_add_tail(&client->node, &qgpu_clients);
	cg->clients++;
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
	obj->enabled = true;
	parent = qgpu_obj_find(client, hparent);
	obj->gpu = obj->kind == QGPU_OBJ_DEVICE ? (int)device_index : parent ? parent->gpu : -1;
	list_add_tail(&obj->node, &client->objects);
	if (obj->kind == QGPU_OBJ_TSG)
		client->cg->tsgs++;
	else if (obj->kind == QGPU_OBJ_CHANNEL)
		client->cg->channels++;
	return obj;
}

static void obj_drop(struct qgpu_client *client, struct qgpu_obj *obj)
{
	struct qgpu_cg *cg = client->cg;

	qgpu_gate_put(obj);
	if (obj->kind == QGPU_OBJ_TSG)
		cg->tsgs--;
	else if (obj->kind == QGPU_OBJ_CHANNEL)
		cg->channels--;
	qgpu_userd_obj_drop(client->handle, obj);
	list_del(&obj->node);
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
	kfree(client);
	cg->clients--;
	qgpu_cg_put_if_unused(cg);
}

void qgpu_track_free(u32 hclient, u32 hobject)
{
	struct qgpu_client *client = qgpu_client_find(hclient);

	if (!client)
		return;
	if (hobject == hclient || hobject == 0)
		client_drop(client);
	else
		subtree_drop(client, hobject, 0);
}

void qgpu_track_file_released(struct file *file)
{
	struct qgpu_client *client, *ctmp;
	struct qgpu_mapping *m, *mtmp;

	list_for_each_entry_safe(client, ctmp, &qgpu_clients, node)
		if (client->file == file)
			client_drop(client);
	list_for_each_entry_safe(m, mtmp, &mappings, node) {
		if (m->file == file) {
			list_del(&m->node);
			kfree(m);
		}
	}
}

void qgpu_track_mapping(struct file *file, const struct nvos33_params_with_fd *p)
{
	struct qgpu_mapping *m = qgpu_mapping_of(file);

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

struct qgpu_mapping *qgpu_mapping_of(struct file *file)
{
	struct qgpu_mapping *m;

	list_for_each_entry(m, &mappings, node)
		if (m->file == file)
			return m;
	return NULL;
}

void qgpu_track_exit(void)
{
	struct qgpu_client *client, *ctmp;
	struct qgpu_mapping *m, *mtmp;
	struct qgpu_cg *cg, *cgtmp;

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
}

/*
 * The controls by which a tenant could steer how its own work is scheduled, and so undo or
 * outrun qgpu's slices (numbers: 580.142's src/common/sdk/nvidia/inc/ctrl/ctrla06c.h,
 * ctrla06f/ctrla06fgpfifo.h, ctrl2080/ctrl2080fifo.h, ctrl2080/ctrl2080gr.h). The tenant guard
 * decides what becomes of them (tenant_verdict() in ioctl.c).
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
