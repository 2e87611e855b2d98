// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: RM_CONTROL on TSGs, channels and subdevices.
 *
 * Commands are dispatched by the class of the object they are sent to, as in RM; a command the
 * object does not export answers NV_ERR_NOT_SUPPORTED, and a known command whose parameter size
 * is not exactly its struct's answers NV_ERR_INVALID_ARGUMENT. What the H200 showed is what the
 * engine does: FIFO_DISABLE_CHANNELS stops channels and SET_TIMESLICE sets the TSG's slice;
 * GPFIFO_SCHEDULE(bEnable=0), PREEMPT and interleave levels are accepted and change nothing.
 *
 * The checks RM makes on the host before a control runs, as in 580.142's _rmapiRmControl
 * (src/nvidia/src/kernel/rmapi/control.c): the NULL command answers NV_OK at once; the
 * IRQL_RAISED and LOCK_BYPASS flags are refused for every command nvmock models (none is in
 * rmapiRmControlCanBeRaisedIrql or rmapiRmControlCanBeBypassLock, rmapi_specific.c). The access
 * right RS_ACCESS_NICE (the export tables' accessRight 0x2, src/nvidia/generated/g_*_nvoc.c) is
 * granted to privileged clients and to CAP_SYS_NICE (rs_access_rights.c, cliresAccessCallback
 * in client_resource.c, osCheckAccess in kernel-open/nvidia/os-interface.c).
 *
 * Controls flagged ROUTE_TO_PHYSICAL in those tables run inside GSP firmware on a GSP GPU, whose
 * code is not published: nvmock checks what the host checks first and answers
 * NV_ERR_NOT_SUPPORTED, unless a measurement on the H200 says what GSP answered.
 */
#include <linux/capability.h>
#include <linux/delay.h>
#include <linux/ktime.h>
#include <linux/math64.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "nvmock.h"

/*
 * How long a control that RM sends to GSP takes before it acts, us: the p50 of 1 000 calls of
 * each, measured on an H200 (580.159.04; tools/gpu/control_times.py, calls 33A and 34A, two runs
 * each) on a CUDA context that waits (idle) and on an 8192 bf16 matmul trainer running alone
 * (busy); the ranges are the runs':
 *
 *   SET_TIMESLICE                 idle 260-302, busy 447-456 (sent to GSP before RM keeps it)
 *   GR_GET_CTXSW_MODES            idle 231-267, busy 281-396 (ROUTE_TO_PHYSICAL)
 *   GR_SET_CTXSW_PREEMPTION_MODE  idle 361-377, busy 560-661 (ROUTE_TO_PHYSICAL)
 *   GR_GET_CTXSW_STATS            idle 290,     busy 234-413 (ROUTE_TO_PHYSICAL; calls 34A)
 *   FIFO_DISABLE_CHANNELS close   idle 476-477, busy 837-853 (NV_RM_RPC_CONTROL)
 *   FIFO_DISABLE_CHANNELS open    idle 368-375, busy 446-451
 *
 * and, timed the same way (call 34C, two runs, --extra), the controls qgpu.ko sees tenants send:
 *
 *   PREEMPT (bWait)               idle 277-304, busy 535-549
 *   GPFIFO_SCHEDULE (a TSG's)     idle 237-242, busy 254-309
 *   SET_INTERLEAVE_LEVEL (TSG)    idle 213-219, busy 209-301
 *   MAKE_REALTIME                 idle 211-216, busy 292-304
 *   RESTART_RUNLIST               idle 285-290, busy 294-303
 *   FIFO_RUNLIST_SET_SCHED_POLICY 368-406 beside a trainer (the doctor's median of two calls,
 *                                 tools/gpu/results/2026-11-26-doctor-h200.json); idle not timed
 *
 * and QUERY_ECC_STATUS (ROUTE_TO_PHYSICAL) 226, 246 and 359 us in the H200 trace's three calls
 * (lines 2348, 2782, 2783: a context with nothing running; nvmock takes the median for both),
 *
 * where GET_TIMESLICE, which the host answers from what it keeps, took 6-14 us and RM's NULL
 * control 2-8 us. nvmock takes the median of the runs' p50s, the busy one where a TSG is on its
 * engine. A close's busy time includes taking the running context off, which nvmock's engine
 * does after the wait (subdevice_disable_channels()), so a close waits its idle time in both.
 *
 * The wait spins, as RM does: _kgspRpcRecvPoll (src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c,
 * 580.142) polls GSP's queue for the answer with osSpinLoop(), an empty function, on the
 * caller's CPU. A sleep would not keep the time in the VM either: in QEMU's TCG a 300 us sleep
 * from userspace took 636 us (p50), and a control that slept fsleep(300) here over 1 ms
 * (2026-12-03). The wait holds nvmock_lock, so the controls of all callers queue behind it: RM
 * sends the RPC holding the GPU's lock (rpcRmApiControl_GSP, src/nvidia/src/kernel/vgpu/rpc.c,
 * takes it where the caller did not). Measured on that H200 (control_times.py's queue study,
 * calls 34A and 34B): another client's GET_TIMESLICE waited out each of them, and two clients'
 * controls ran one at a time, except two SET_TIMESLICEs, which overlapped (5 720-6 070 answered
 * a second together, each p50 280-292 us, where one at a time allows 3 400), and two
 * GR_GET_CTXSW_MODES, partly (4 950-5 700 a second against 4 100): nvmock runs those one at a
 * time too.
 *
 * gsp_pct scales every time: 100 is the H200's, 0 answers at once, and a test that wants a
 * control in flight for long asks for more; waits over GSP_SPIN_MAX_US sleep.
 */
enum gsp_control {
	GSP_SET_TIMESLICE,
	GSP_GET_CTXSW_MODES,
	GSP_SET_PREEMPTION_MODE,
	GSP_GET_CTXSW_STATS,
	GSP_DISABLE_CHANNELS,
	GSP_ENABLE_CHANNELS,
	GSP_PREEMPT,
	GSP_SCHEDULE,
	GSP_INTERLEAVE,
	GSP_MAKE_REALTIME,
	GSP_RESTART_RUNLIST,
	GSP_SCHED_POLICY,
	GSP_ECC_STATUS,
};

static const struct {
	unsigned int idle_us;
	unsigned int busy_us;
} gsp_times[] = {
	[GSP_SET_TIMESLICE] = { 280, 450 },
	[GSP_GET_CTXSW_MODES] = { 240, 380 },
	[GSP_SET_PREEMPTION_MODE] = { 370, 655 },
	[GSP_GET_CTXSW_STATS] = { 290, 324 },
	[GSP_DISABLE_CHANNELS] = { 477, 477 },
	[GSP_ENABLE_CHANNELS] = { 370, 450 },
	[GSP_PREEMPT] = { 290, 542 },
	[GSP_SCHEDULE] = { 240, 282 },
	[GSP_INTERLEAVE] = { 216, 255 },
	[GSP_MAKE_REALTIME] = { 214, 298 },
	[GSP_RESTART_RUNLIST] = { 288, 298 },
	[GSP_SCHED_POLICY] = { 387, 387 },
	[GSP_ECC_STATUS] = { 246, 246 },
};

#define GSP_SPIN_MAX_US	10000

static unsigned int gsp_pct = 100;
module_param(gsp_pct, uint, 0644);
MODULE_PARM_DESC(gsp_pct, "GSP controls take this percent of their time on an H200; 0: none");

static void gsp_rpc(struct nvmock_gpu *gpu, enum gsp_control which)
{
	bool busy = READ_ONCE(gpu->engine.pinned);
	u64 us = busy ? gsp_times[which].busy_us : gsp_times[which].idle_us;
	ktime_t end;

	us = div_u64(us * READ_ONCE(gsp_pct), 100);
	if (us > GSP_SPIN_MAX_US) {
		msleep(DIV_ROUND_UP_ULL(us, 1000));
		return;
	}
	end = ktime_add_us(ktime_get(), us);
	while (ktime_before(ktime_get(), end))
		cpu_relax();
}

struct control_desc {
	u32 cmd;
	enum nvmock_kind kind;
	u32 size;
	u32 (*handler)(const struct nvmock_caller *caller, struct nvmock_object *obj, void *params);
};

static void schedule_channel(struct nvmock_channel *ch)
{
	struct nvmock_engine *engine = &ch->gpu->engine;

	spin_lock(&engine->lock);
	ch->scheduled = true;
	spin_unlock(&engine->lock);
}

static u32 check_schedule(const struct nva06c_gpfifo_schedule_params *p)
{
	if (p->bEnable && (p->bSkipSubmit || p->bSkipEnable))
		return NV_ERR_INVALID_ARGUMENT;
	if (p->bSkipSubmit && p->bSkipEnable)
		return NV_ERR_INVALID_ARGUMENT;
	return NV_OK;
}

static u32 tsg_gpfifo_schedule(const struct nvmock_caller *caller, struct nvmock_object *obj,
			       void *params)
{
	const struct nva06c_gpfifo_schedule_params *p = params;
	struct nvmock_object *child;
	u32 status = check_schedule(p);

	if (status != NV_OK)
		return status;
	gsp_rpc(obj->gpu, GSP_SCHEDULE);
	if (!p->bEnable)
		return NV_OK;	/* disabling is accepted and ignored, as on the H200 */
	list_for_each_entry(child, &obj->children, sibling)
		if (child->kind == NVMOCK_CHANNEL)
			schedule_channel(child->channel);
	return NV_OK;
}

static u32 channel_gpfifo_schedule(const struct nvmock_caller *caller,
				   struct nvmock_object *obj, void *params)
{
	const struct nva06c_gpfifo_schedule_params *p = params;
	u32 status = check_schedule(p);

	/* The TSG's takes GSP's time; a channel's was not timed, and answers at once. */
	if (status == NV_OK && p->bEnable)
		schedule_channel(obj->channel);
	return status;
}

/*
 * SET_TIMESLICE and GET_TIMESLICE (580.142, src/nvidia/src/kernel/gpu/fifo/
 * kernel_channel_group_api.c). On a GSP GPU kchangrpapiCtrlCmdSetTimeslice sends the control to
 * GSP first and, only if GSP answers NV_OK, keeps the value in the TSG's KernelChannelGroup
 * (timesliceUs); kchangrpapiCtrlCmdGetTimeslice answers that kept value without asking GSP: the
 * default given at construction (kchangrpConstruct in kernel_channel_group.c:
 * kfifoChannelGroupGetDefaultTimeslice, 1024 us from Volta on) or the last value set. nvmock
 * keeps the value per TSG the same way and its engine runs the TSG for that long. What GSP
 * checks and programs into the runlist is in its firmware, not published. Measured on an H100
 * (580.159.04, tests/vm/rmcases.py tsg_timeslice and tsg_timeslice_bounds): GSP refused no
 * value, 0 and 2^63 included, and each read back as set; so nvmock keeps any value. What the
 * hardware does with 0 or with more than 10^9 us is not known: nvmock's engine runs such a TSG
 * for 1 us or 10^9 us (engine.c), and acts as the H100 measured (docs/gpu-measurements.md),
 * not as GSP is known to.
 */
static u32 tsg_set_timeslice(const struct nvmock_caller *caller, struct nvmock_object *obj,
			     void *params)
{
	const struct nva06c_timeslice_params *p = params;
	struct nvmock_engine *engine = &obj->gpu->engine;
	struct nvmock_channel *ch;

	gsp_rpc(obj->gpu, GSP_SET_TIMESLICE);
	spin_lock(&engine->lock);
	obj->tsg->timeslice_us = p->timesliceUs;
	/* It woke a channel a sched-only close had stalled (subdevice_disable_channels()). */
	list_for_each_entry(ch, &obj->tsg->channels, tsg_node)
		ch->stalled = false;
	spin_unlock(&engine->lock);
	return NV_OK;
}

static u32 tsg_get_timeslice(const struct nvmock_caller *caller, struct nvmock_object *obj,
			     void *params)
{
	struct nva06c_timeslice_params *p = params;

	p->timesliceUs = READ_ONCE(obj->tsg->timeslice_us);
	return NV_OK;
}

static u32 tsg_preempt(const struct nvmock_caller *caller, struct nvmock_object *obj,
		       void *params)
{
	const struct nva06c_preempt_params *p = params;

	if (p->bManualTimeout && p->timeoutUs > NVA06C_PREEMPT_MAX_TIMEOUT_US)
		return NV_ERR_INVALID_ARGUMENT;
	gsp_rpc(obj->gpu, GSP_PREEMPT);
	return NV_OK;
}

/* RS_ACCESS_NICE: the kernel is privileged; a process needs CAP_SYS_NICE. */
static bool nice_allowed(const struct nvmock_caller *caller)
{
	return caller->kernel || capable(CAP_SYS_NICE);
}

/*
 * LOW, MEDIUM or HIGH. On a GSP GPU the value goes to GSP first, and a refusal from GSP is
 * NV_ERR_NOT_SUPPORTED (kchangrpapiCtrlCmdSetInterleaveLevel, kernel_channel_group_api.c, and
 * kchannelCtrlCmdSetInterleaveLevel: NV_CHECK_OR_RETURN after the RPC), before the host's own
 * check in kchangrpSetInterleaveLevel (kernel_channel_group.c) is reached. Measured on an H100:
 * level 3 NV_ERR_NOT_SUPPORTED, LOW and HIGH NV_OK (tests/vm/rmcases.py tsg_timeslice). The H200
 * did not change its 1:1 split for a level (docs/gpu-measurements.md section 2): the engine
 * ignores it.
 */
static u32 set_interleave(const struct nvmock_caller *caller, struct nvmock_tsg *tsg, u32 level)
{
	if (!nice_allowed(caller))
		return NV_ERR_INSUFFICIENT_PERMISSIONS;
	/* Timed on a TSG; a channel's takes the same, an assumption: it was not timed. */
	gsp_rpc(tsg->gpu, GSP_INTERLEAVE);
	if (level > NVA06C_INTERLEAVE_LEVEL_HIGH)
		return NV_ERR_NOT_SUPPORTED;
	WRITE_ONCE(tsg->interleave, level);
	return NV_OK;
}

static u32 tsg_set_interleave(const struct nvmock_caller *caller, struct nvmock_object *obj,
			      void *params)
{
	const struct nva06c_interleave_level_params *p = params;

	return set_interleave(caller, obj->tsg, p->tsgInterleaveLevel);
}

/* A channel's level is its TSG's: set on one channel, it is every channel's of the TSG. */
static u32 channel_set_interleave(const struct nvmock_caller *caller,
				  struct nvmock_object *obj, void *params)
{
	const struct nva06f_interleave_level_params *p = params;

	return set_interleave(caller, obj->channel->tsg, p->channelInterleaveLevel);
}

/*
 * MAKE_REALTIME (TSG), RESTART_RUNLIST (channel) and FIFO_RUNLIST_SET_SCHED_POLICY (subdevice):
 * ROUTE_TO_PHYSICAL with RS_ACCESS_NICE. Past the host's checks they are GSP's, whose code is
 * closed. Measured: GSP answered NV_OK to each, from root, on an H100 (the doctor, call 28B:
 * MAKE_REALTIME on and off, RESTART_RUNLIST with bForceRestart, CHANNEL_INTERLEAVED) and an
 * H200 (the doctor, 2026-11-26, the same; control_times.py --extra, call 34C: MAKE_REALTIME off
 * and RESTART_RUNLIST without bForceRestart, 1 000 calls each). What they change on the GPU is
 * GSP's: the doctor's levers built on them gave no better online latency than native
 * (docs/levers.md), and nvmock's engine ignores them. Until 2026-12-03 nvmock answered
 * NV_ERR_NOT_SUPPORTED, which no GPU did.
 */
static u32 nice_then_gsp(const struct nvmock_caller *caller, struct nvmock_object *obj,
			 enum gsp_control which)
{
	if (!nice_allowed(caller))
		return NV_ERR_INSUFFICIENT_PERMISSIONS;
	gsp_rpc(obj->gpu, which);
	return NV_OK;
}

static u32 tsg_make_realtime(const struct nvmock_caller *caller, struct nvmock_object *obj,
			     void *params)
{
	return nice_then_gsp(caller, obj, GSP_MAKE_REALTIME);
}

static u32 channel_restart_runlist(const struct nvmock_caller *caller,
				   struct nvmock_object *obj, void *params)
{
	return nice_then_gsp(caller, obj, GSP_RESTART_RUNLIST);
}

static u32 subdevice_sched_policy(const struct nvmock_caller *caller,
				  struct nvmock_object *obj, void *params)
{
	return nice_then_gsp(caller, obj, GSP_SCHED_POLICY);
}

/*
 * STOP_CHANNEL: no access right. kchannelCtrlCmdStopChannel (src/nvidia/src/kernel/gpu/fifo/
 * kernel_channel.c) sends it to GSP, then raises the channel's error notifier (not modelled).
 * What GSP does is modelled on ctrla06fgpfifo.h's description: the channel is disabled and off
 * the runlist, and runs again only once enabled and scheduled again.
 */
static u32 channel_stop(const struct nvmock_caller *caller, struct nvmock_object *obj,
			void *params)
{
	struct nvmock_engine *engine = &obj->gpu->engine;

	spin_lock(&engine->lock);
	/* Whether GSP counts it among the closes is unknown: one open undoes it here. */
	if (!obj->channel->disables)
		obj->channel->disables = 1;
	obj->channel->disables_max = max(obj->channel->disables_max, 1u);
	obj->channel->scheduled = false;
	spin_unlock(&engine->lock);
	return NV_OK;
}

/*
 * The context a GR preemption control names: hChannel, a channel or a TSG of the caller's client
 * on the subdevice's GPU; a channel's is its TSG's (a GR context is a TSG's).
 */
static struct nvmock_tsg *gr_context(struct nvmock_object *subdevice, u32 hchannel)
{
	struct nvmock_object *target = nvmock_object_get(subdevice->client, hchannel);

	if (!target || target->gpu != subdevice->gpu)
		return NULL;
	if (target->kind == NVMOCK_TSG)
		return target->tsg;
	if (target->kind == NVMOCK_CHANNEL)
		return target->channel->tsg;
	return NULL;
}

/*
 * GR_SET_CTXSW_PREEMPTION_MODE: ROUTE_TO_PHYSICAL, no access right. What is known of GSP's
 * answer: CUDA sends it once while it sets up a context, CILP for compute on its TSG's handle,
 * and the H200 answered NV_OK (qpolicy/nvrm/data/h200-pytorch-matmul.jsonl.gz); the doctor's
 * CTA on each compute channel of a trainer answered NV_OK and turned the trainer's saves from
 * CILP to CTA (1 190 of 1 224, docs/levers.md); on an H200, CTA set through one of its eight
 * compute channels, or through its TSG's handle, did the same and was read back on all eight
 * (tools/gpu/preemption_modes.py, call 32A): one mode per context. nvmock takes a channel or
 * TSG of the client on this GPU and modes in the ranges of ctrl2080gr.h, and keeps the compute
 * mode for GR_GET_CTXSW_MODES; the rest of GSP's checks are unknown. Preemption is not
 * simulated: the engine runs a slice to its end, whatever the mode.
 */
static u32 subdevice_set_ctxsw_preemption(const struct nvmock_caller *caller,
					  struct nvmock_object *obj, void *params)
{
	const struct nv2080_ctxsw_preemption_mode_params *p = params;
	struct nvmock_tsg *tsg = gr_context(obj, p->hChannel);

	if (!tsg)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	if ((p->flags & NV2080_CTXSW_PREEMPTION_FLAG_CILP) &&
	    p->cilpPreemptMode > NV2080_CTXSW_PREEMPTION_COMPUTE_CILP)
		return NV_ERR_INVALID_ARGUMENT;
	if ((p->flags & NV2080_CTXSW_PREEMPTION_FLAG_GFXP) &&
	    p->gfxpPreemptMode > NV2080_CTXSW_PREEMPTION_GFX_GFXP_POOL)
		return NV_ERR_INVALID_ARGUMENT;
	gsp_rpc(obj->gpu, GSP_SET_PREEMPTION_MODE);
	if (p->flags & NV2080_CTXSW_PREEMPTION_FLAG_CILP)
		WRITE_ONCE(tsg->compute_preemption, p->cilpPreemptMode);
	return NV_OK;
}

/*
 * GR_GET_CTXSW_MODES (ctrl2080gr.h; g_subdevice_nvoc.c: flags 0x48, NON_PRIVILEGED |
 * ROUTE_TO_PHYSICAL, no access right: GSP answers, its code closed). The header: hChannel names
 * the channel whose modes are read. Measured on an H100 and an H200 (the doctor's reads of the
 * trainer's and the online stream's compute channels, before any lever; docs/levers.md): NV_OK
 * and CILP on every channel. Measured on an H200 (tools/gpu/preemption_modes.py, call 32A,
 * BENCHMARKS.md): a mode set through one compute channel of a TSG, or through the TSG's handle,
 * is read back on each of its eight compute channels (and the trainer's saves turned CTA); a
 * TSG's handle, computing or not, is answered NV_ERR_INVALID_CHANNEL. nvmock answers the compute
 * mode last set on the channel's context (CILP until then) and 0 for the zcull, PM, SMPC and
 * graphics modes, which it does not model. A read before CUDA's own set is not measured.
 */
static u32 subdevice_get_ctxsw_modes(const struct nvmock_caller *caller,
				     struct nvmock_object *obj, void *params)
{
	struct nv2080_ctxsw_modes_params *p = params;
	struct nvmock_object *target = nvmock_object_get(obj->client, p->hChannel);
	struct nvmock_tsg *tsg = gr_context(obj, p->hChannel);

	if (!tsg)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	if (target->kind != NVMOCK_CHANNEL)
		return NV_ERR_INVALID_CHANNEL;
	gsp_rpc(obj->gpu, GSP_GET_CTXSW_MODES);
	p->zcullMode = 0;
	p->pmMode = 0;
	p->smpcMode = 0;
	p->cilpPreemptMode = READ_ONCE(tsg->compute_preemption);
	p->gfxpPreemptMode = 0;
	return NV_OK;
}

/*
 * GR_GET_CTXSW_STATS (ctrl2080gr.h; g_subdevice_nvoc.c: flags 0x48, NON_PRIVILEGED |
 * ROUTE_TO_PHYSICAL, no access right: GSP answers, its code closed). The header: hChannel names
 * a channel, or the TSG where the channel is in one; RESET in flags sets the counters back to 0.
 * Measured on an H100 and an H200 (tools/gpu/ctxsw_saves.py): NV_OK on a process's compute TSG,
 * from root over that process's own descriptor. nvmock answers for a TSG of the caller's client
 * on this GPU, or a channel with a TSG of its own; what the engine counts is engine.c's
 * (work_in_flight()). What GSP answers for a channel inside a TSG, and whether RESET clears before
 * or after the answer, is not measured: nvmock answers NV_ERR_INVALID_OBJECT_HANDLE, and clears
 * after.
 */
static u32 subdevice_get_ctxsw_stats(const struct nvmock_caller *caller,
				     struct nvmock_object *obj, void *params)
{
	struct nv2080_ctxsw_stats_params *p = params;
	struct nvmock_object *target = nvmock_object_get(obj->client, p->hChannel);
	struct nvmock_engine *engine = &obj->gpu->engine;
	struct nvmock_tsg *tsg;

	if (!target || target->gpu != obj->gpu)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	if (target->kind == NVMOCK_TSG)
		tsg = target->tsg;
	else if (target->kind == NVMOCK_CHANNEL && target->channel->own_tsg)
		tsg = target->channel->tsg;
	else
		return NV_ERR_INVALID_OBJECT_HANDLE;
	gsp_rpc(obj->gpu, GSP_GET_CTXSW_STATS);
	spin_lock(&engine->lock);
	p->saveCnt = tsg->saves;
	p->restoreCnt = tsg->restores;
	p->wfiSaveCnt = tsg->wfi_saves;
	p->ctaSaveCnt = 0;
	p->cilpSaveCnt = tsg->cilp_saves;
	p->gfxpSaveCnt = 0;
	if (p->flags & NV2080_CTXSW_STATS_FLAG_RESET) {
		tsg->saves = 0;
		tsg->restores = 0;
		tsg->wfi_saves = 0;
		tsg->cilp_saves = 0;
	}
	spin_unlock(&engine->lock);
	return NV_OK;
}

static u32 channel_work_submit_token(const struct nvmock_caller *caller,
				     struct nvmock_object *obj, void *params)
{
	struct nvc36f_work_submit_token_params *p = params;

	/* (runlist << 16) | chid; every channel of the mock is on runlist 0. */
	p->workSubmitToken = obj->channel->chid;
	return NV_OK;
}

/*
 * GET_CLASS_ENGINEID on a channel (kchannelCtrlCmdGetClassEngineid_IMPL, kernel_channel.c;
 * kchannelGetClassEngineID_GM107, arch/maxwell/kernel_channel_gm107.c): hObject 0
 * NV_ERR_OBJECT_NOT_FOUND, the client's own handle NV_ERR_INVALID_ARGUMENT, anything that is not
 * a child of this channel NV_ERR_OBJECT_NOT_FOUND (kchannelFindChildByHandle); else its class,
 * the class again as classEngineID (SET_OBJECT's NVCLASS field, 15:0) and its engine. Measured
 * on an H100 (rmcases.py channel_queries): compute 0xcbc0 on engine 1, copy CE 1 0xc8b5 on 0xa,
 * CE 2 on 0xb, as libcuda was answered on the H200 (the trace's lines 2509, 2511).
 */
static u32 channel_get_class_engineid(const struct nvmock_caller *caller,
				      struct nvmock_object *obj, void *params)
{
	struct nv906f_class_engineid_params *p = params;
	struct nvmock_object *child;

	if (!p->hObject)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (p->hObject == obj->client->handle)
		return NV_ERR_INVALID_ARGUMENT;
	child = nvmock_object_get(obj->client, p->hObject);
	if (!child || child->parent != obj)
		return NV_ERR_OBJECT_NOT_FOUND;
	p->classID = child->hclass;
	p->classEngineID = child->hclass & 0xffff;
	p->engineID = child->kind == NVMOCK_COMPUTE || child->kind == NVMOCK_COPY ?
		      child->engine_type : 0;
	return NV_OK;
}

/* RM copies an embedded list of at most this many bytes (RMAPI_PARAM_COPY_MAX_PARAMS_SIZE). */
#define EMBEDDED_MAX	SZ_1M

/*
 * GET_CHANNELLIST on a device (deviceCtrlCmdFifoGetChannelList_IMPL, kernel_fifo_ctrl.c): for
 * each handle of the list, the channel's ID where it names a channel of the client, else
 * NV0080_CTRL_FIFO_GET_CHANNELLIST_INVALID_CHANNEL; always NV_OK but for an empty list
 * (NV_ERR_INVALID_ARGUMENT). Both lists are embedded pointers (embedded_param_copy.c), copied
 * in and out by numChannels words from a process: NULL or over 1 MiB NV_ERR_INVALID_ARGUMENT
 * (rmapiParamsAcquire), unreadable NV_ERR_INVALID_ADDRESS (os_memcpy_from_user); a kernel
 * caller's are used in place. Measured on an H100 (rmcases.py channel_queries): a channel, an
 * unknown handle and a TSG gave an ID, 0xffffffff and 0xffffffff; the empty list and a list
 * at address 8 were refused so; the freed channel gave 0xffffffff.
 */
static u32 device_get_channel_list(const struct nvmock_caller *caller, struct nvmock_object *obj,
				   void *params)
{
	const struct nv0080_channellist_params *p = params;
	size_t bytes = (size_t)p->numChannels * sizeof(u32);
	u32 *handles, *ids, i, status = NV_OK;

	if (!p->numChannels || !p->pChannelHandleList || !p->pChannelList || bytes > EMBEDDED_MAX)
		return NV_ERR_INVALID_ARGUMENT;
	if (caller->kernel) {
		handles = (u32 *)(uintptr_t)p->pChannelHandleList;
		ids = (u32 *)(uintptr_t)p->pChannelList;
	} else {
		/* One copy: each ID overwrites the handle it was looked up by. */
		handles = kvmalloc(bytes, GFP_KERNEL);
		if (!handles)
			return NV_ERR_NO_MEMORY;
		ids = handles;
		if (copy_from_user(handles, u64_to_user_ptr(p->pChannelHandleList), bytes)) {
			kvfree(handles);
			return NV_ERR_INVALID_ADDRESS;
		}
	}
	for (i = 0; i < p->numChannels; i++) {
		struct nvmock_object *ch = nvmock_object_get(obj->client, handles[i]);

		ids[i] = ch && ch->kind == NVMOCK_CHANNEL ? ch->channel->chid :
			 NV0080_CTRL_FIFO_GET_CHANNELLIST_INVALID_CHANNEL;
	}
	if (caller->kernel)
		return NV_OK;
	if (copy_to_user(u64_to_user_ptr(p->pChannelList), ids, bytes))
		status = NV_ERR_INVALID_ADDRESS;
	kvfree(handles);
	return status;
}

/*
 * The size of an H200's GR context with its buffers, as libcuda was answered (the trace's line
 * 2513: 0x52f000). An H100 answered 0x502000 (rmcases.py channel_queries, call 48C); nvmock's
 * GPUs are H200s.
 */
#define GR_CTX_BUFFER_SIZE	0x52f000

/*
 * GR_GET_CTX_BUFFER_SIZE (subdeviceCtrlCmdKGrGetCtxBufferSize_IMPL, kernel_graphics.c; answered
 * by the host from the buffers it allocated, not sent to GSP): hChannel not in the client
 * NV_ERR_OBJECT_NOT_FOUND, not a channel NV_ERR_INVALID_CHANNEL (CliGetKernelChannel), a channel
 * whose context has no main buffer NV_ERR_INVALID_OBJECT (kgrctxGetCtxBuffers_IMPL,
 * kernel_graphics_context.c), else the size. Measured on an H100 (rmcases.py channel_queries):
 * a compute channel its size, a TSG's handle, an unknown one and a channel of a copy-engine TSG
 * refused so. nvmock gives a TSG its main buffer with its first compute object; when RM
 * allocates it is not modelled further (RM asked on a compute TSG before it has one: not
 * measured).
 */
static u32 subdevice_get_ctx_buffer_size(const struct nvmock_caller *caller,
					 struct nvmock_object *obj, void *params)
{
	struct nv2080_ctx_buffer_size_params *p = params;
	struct nvmock_object *target = nvmock_object_get(obj->client, p->hChannel);

	if (!target)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (target->kind != NVMOCK_CHANNEL)
		return NV_ERR_INVALID_CHANNEL;
	if (!target->channel->tsg->gr_ctx)
		return NV_ERR_INVALID_OBJECT;
	p->totalBufferSize = GR_CTX_BUFFER_SIZE;
	return NV_OK;
}

/*
 * The ECC units an H100 answered enabled, scrubbed and supported (rmcases.py ecc_status, call
 * 48D: units 0, 1, 3-5, 9-16 and 18-24 of NV2080_CTRL_GPU_ECC_UNIT_COUNT; the others all clear).
 * The H200 trace keeps only the first two units of libcuda's answers (lines 2782, 2783), both
 * set, as here; what an H200 answers for the rest is not known.
 */
#define ECC_UNITS_ON	0x1fdfe3bu

/*
 * QUERY_ECC_STATUS: ROUTE_TO_PHYSICAL (g_subdevice_nvoc.c, flags 0x50158), so GSP answers and
 * its code is closed. Modelled on the H100's answer: NV_OK, each unit of ECC_UNITS_ON enabled,
 * scrubbed and supported, every error count 0 (a real host's counts are its own), no poison and
 * no uncorrectable error; a short parameter struct is refused as every control's is (measured:
 * NV_ERR_INVALID_ARGUMENT). The call takes GSP's time.
 */
static u32 subdevice_query_ecc_status(const struct nvmock_caller *caller,
				      struct nvmock_object *obj, void *params)
{
	struct nv2080_ecc_status_params *p = params;
	u32 unit;

	gsp_rpc(obj->gpu, GSP_ECC_STATUS);
	memset(p->units, 0, sizeof(p->units));
	for (unit = 0; unit < NV2080_CTRL_GPU_ECC_UNIT_COUNT; unit++) {
		bool on = ECC_UNITS_ON & BIT(unit);

		p->units[unit].enabled = on;
		p->units[unit].scrubComplete = on;
		p->units[unit].supported = on;
	}
	p->bFatalPoisonError = 0;
	p->uncorrectableError = 0;
	return NV_OK;
}

/*
 * FIFO_DISABLE_CHANNELS (kernel_fifo_ctrl.c: subdeviceCtrlCmdFifoDisableChannels_IMPL): a process
 * may not pass pRunlistPreemptEvent; on a GSP GPU the rest is sent to GSP, whose code is not
 * published. What it does is modelled on ctrl2080fifo.h's description of
 * NV2080_CTRL_FIFO_DISABLE_CHANNELS_PARAMS and on the H200's hard stop (h200-findings.md). A list
 * naming a channel RM invalidated (its handle kept, the channel gone in GSP) is answered
 * NV_ERR_INVALID_CHANNEL, alone or beside a live one (an H100, rmcases.py invalidated_objects,
 * call 50A); whether the live one was closed then is not measured (nvmock: all or nothing), nor
 * the answer for a handle never made (nvmock: NV_ERR_INVALID_OBJECT_HANDLE).
 */
#define DISABLE_WAIT_MS	10

/*
 * Whether the engine still holds one of @channels' TSGs with nothing of it left to run: it is
 * about to take it off (engine_thread() unpins a TSG once run_slice() is done with it).
 */
static bool still_on_engine(struct nvmock_engine *engine, struct nvmock_channel **channels,
			    u32 n)
{
	struct nvmock_tsg *pinned;
	bool on = false;
	u32 i;

	spin_lock(&engine->lock);
	pinned = READ_ONCE(engine->pinned);
	for (i = 0; i < n && !on; i++) {
		struct nvmock_channel *other;
		bool others = false;

		if (channels[i]->tsg != pinned)
			continue;
		list_for_each_entry(other, &pinned->channels, tsg_node)
			others |= nvmock_channel_enabled(other) && other->scheduled;
		on = !others;
	}
	spin_unlock(&engine->lock);
	return on;
}

static u32 subdevice_disable_channels(const struct nvmock_caller *caller,
				      struct nvmock_object *obj, void *params)
{
	const struct nv2080_fifo_disable_channels_params *p = params;
	struct nvmock_channel *channels[NV2080_DISABLE_CHANNELS_MAX];
	struct nvmock_engine *engine = &obj->gpu->engine;
	u32 i;

	/* RM refuses it before the list reaches GSP, whatever the list holds. */
	if (p->pRunlistPreemptEvent && !caller->kernel)
		return NV_ERR_INSUFFICIENT_PERMISSIONS;
	if (p->numChannels > NV2080_DISABLE_CHANNELS_MAX)
		return NV_ERR_INVALID_ARGUMENT;
	/* All or nothing: every named channel is checked before any is touched. */
	for (i = 0; i < p->numChannels; i++) {
		struct nvmock_client *client;
		struct nvmock_object *ch;
		u32 status = nvmock_caller_client(caller, p->hClientList[i], &client);

		if (status != NV_OK)
			return status;
		ch = nvmock_object_get(client, p->hChannelList[i]);
		if (ch && ch->kind == NVMOCK_INVALID &&
		    nvmock_class_kind(ch->hclass) == NVMOCK_CHANNEL)
			return NV_ERR_INVALID_CHANNEL;
		if (!ch || ch->kind != NVMOCK_CHANNEL)
			return NV_ERR_INVALID_OBJECT_HANDLE;
		if (ch->gpu != obj->gpu)
			return NV_ERR_INVALID_ARGUMENT;
		channels[i] = ch->channel;
	}
	/*
	 * bOnlyDisableScheduling=0 (what qgpu sends): none of the channels runs once the control
	 * returns, work on the engine included ("the call will ensure none of the listed channels
	 * are running in hardware"): the engine stops within a chunk (chunk_us), and the call waits
	 * for it to take their TSG off (its context saved, engine.c), as long as the TSG has no
	 * other channel left to run, and DISABLE_WAIT_MS at most. A close read on an H100 and an
	 * H200 right after it returned had always saved the running kernel's context
	 * (tools/gpu/ctxsw_saves.py). bOnlyDisableScheduling=1: not scheduled again, but a channel
	 * whose TSG is on the engine finishes the work it has started and fetches no more; it is
	 * taken off at its slice's end where another TSG has work (engine.c). Enabling ignores it.
	 *
	 * Closes nest: a channel closed twice runs again only after two opens, and an open of a
	 * channel not closed does nothing (an H200, 580.159.04: tools/gpu/disable_nesting.py,
	 * call 21C; sched-only closes count alike). What GSP keeps is closed; the count is the
	 * model of what it did.
	 *
	 * A sched-only close of a channel with GPFIFO entries not yet fetched stalls it: on that
	 * H200 a trainer with kernels queued behind the running one, so closed, ran nothing after
	 * its open (nor after another open), until a full close and open or a SET_TIMESLICE on its
	 * TSG (the same value) woke it (tools/gpu/disable_nesting.py --steps stall, call 21F; in
	 * call 21E the first or second of each series of ten such closes). With none queued it
	 * ran on after the open (calls 21B-D).
	 * Whether a new GPFIFO entry would wake it is unknown: nvmock's does not.
	 */
	gsp_rpc(obj->gpu, p->bDisable ? GSP_DISABLE_CHANNELS : GSP_ENABLE_CHANNELS);
	spin_lock(&engine->lock);
	for (i = 0; i < p->numChannels; i++) {
		struct nvmock_channel *ch = channels[i];

		if (!p->bDisable) {
			if (ch->disables)
				ch->disables--;
			continue;
		}
		if (ch->disables < U32_MAX)
			ch->disables++;
		ch->disables_max = max(ch->disables_max, ch->disables);
		ch->finish_slice = p->bOnlyDisableScheduling &&
				   READ_ONCE(engine->pinned) == ch->tsg;
		ch->stalled = p->bOnlyDisableScheduling &&
			      (ch->stalled || nvmock_channel_queued(ch));
	}
	spin_unlock(&engine->lock);
	if (p->bDisable && !p->bOnlyDisableScheduling)
		wait_event_timeout(engine->released, !still_on_engine(engine, channels,
								      p->numChannels),
				   msecs_to_jiffies(DISABLE_WAIT_MS));
	return NV_OK;
}

/*
 * CLIENT_GET_HANDLE_INFO 0xd02, on the client itself: cliresCtrlCmdClientGetHandleInfo
 * (src/nvidia/src/kernel/rmapi/client_resource.c) looks the handle up in the client the control
 * was sent to (serverutilGetResourceRef: NV_ERR_OBJECT_NOT_FOUND when it is not there, as
 * clientGetResourceRef in resserv's rs_client.c answers) and answers its parent's handle (0 for
 * the client itself) or its external class; any other index NV_ERR_INVALID_ARGUMENT. Exported
 * with no access right (g_client_resource_nvoc.c), so any caller that reaches the client may ask.
 */
static u32 client_get_handle_info(const struct nvmock_caller *caller, struct nvmock_object *obj,
				  void *params)
{
	struct nv0000_handle_info_params *p = params;
	struct nvmock_object *target = nvmock_object_get(obj->client, p->hObject);

	if (!target)
		return NV_ERR_OBJECT_NOT_FOUND;
	switch (p->index) {
	case NV0000_HANDLE_INFO_INDEX_PARENT:
		p->data = target->parent ? target->parent->handle : 0;
		return NV_OK;
	case NV0000_HANDLE_INFO_INDEX_CLASSID:
		p->data = target->hclass;
		return NV_OK;
	default:
		return NV_ERR_INVALID_ARGUMENT;
	}
}

/*
 * CLIENT_OBJECTS_ARE_DUPLICATES 0xd07, on the client: cliresCtrlCmdObjectsAreDuplicates
 * (client_resource.c) looks hObject1 up in the client (NV_ERR_OBJECT_NOT_FOUND) and asks it
 * whether hObject2, in the same client, shares its state: for memory, memIsDuplicate
 * (src/nvidia/src/kernel/mem_mgr/mem.c) compares the memory descriptors, and hObject2 must be
 * memory of the client (memGetByHandle: a handle the client does not have
 * NV_ERR_OBJECT_NOT_FOUND, one that is not memory NV_ERR_INVALID_OBJECT_HANDLE). Other classes
 * answer NV_ERR_NOT_SUPPORTED (resIsDuplicate's default). Measured on an H100 (rmcases.py
 * duplicates_refused).
 */
static u32 client_objects_are_duplicates(const struct nvmock_caller *caller,
					 struct nvmock_object *obj, void *params)
{
	struct nv0000_objects_are_duplicates_params *p = params;
	struct nvmock_object *a = nvmock_object_get(obj->client, p->hObject1);
	struct nvmock_object *b = nvmock_object_get(obj->client, p->hObject2);

	if (!a)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (a->kind != NVMOCK_VIDMEM && a->kind != NVMOCK_SYSMEM)
		return NV_ERR_NOT_SUPPORTED;
	if (!b)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (b->kind != NVMOCK_VIDMEM && b->kind != NVMOCK_SYSMEM)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	p->bDuplicates = a->mem == b->mem;
	return NV_OK;
}

/* Entries RM reads from a GET_SURFACE_INFO list at most, in nvmock (RM bounds it by the copy). */
#define SURFACE_INFO_MAX	32

/*
 * GET_SURFACE_INFO 0x410110 on a memory object: memCtrlCmdGetSurfaceInfoLvm
 * (src/nvidia/src/kernel/gpu/mem_mgr/mem_ctrl.c), host-side, no access right
 * (g_mem_nvoc.c). An empty list or a NULL pointer answers NV_OK at once; each entry's data is
 * answered by its index: the size as allocated (memdescGetSize: the rounded size) in bytes
 * (PHYS_SIZE_LO/HI) or in 4 KiB units (PHYS_SIZE), the address space, no compression
 * (ATTRS, COMPR_COVERAGE: 0), and PHYS_ATTR 0: RM answers the bits of the memory's HW resource,
 * which plain uncompressed memory has none of (measured on an H100 for video and system
 * memory: rmcases.py surface_info). An unknown index is NV_ERR_INVALID_ARGUMENT, and a process
 * then finds none of its list written (RM copies the list back on success only; measured
 * there too). The list is an embedded pointer: a user address from a process, a kernel one
 * from the kernel entry.
 */
static u32 mem_get_surface_info(const struct nvmock_caller *caller, struct nvmock_object *obj,
				void *params)
{
	const struct nv0041_surface_info_params *p = params;
	struct nv0041_surface_info list[SURFACE_INFO_MAX];
	void __user *ulist = u64_to_user_ptr(p->surfaceInfoList);
	void *klist = (void *)(uintptr_t)p->surfaceInfoList;
	size_t bytes = p->surfaceInfoListSize * sizeof(list[0]);
	u64 size = obj->mem->size;
	u32 i, status = NV_OK;

	if (!p->surfaceInfoListSize || !p->surfaceInfoList)
		return NV_OK;
	if (p->surfaceInfoListSize > SURFACE_INFO_MAX)
		return NV_ERR_INVALID_ARGUMENT;
	if (caller->kernel)
		memcpy(list, klist, bytes);
	else if (copy_from_user(list, ulist, bytes))
		return NV_ERR_INVALID_POINTER;
	for (i = 0; i < p->surfaceInfoListSize; i++) {
		status = NV_OK;
		switch (list[i].index) {
		case NV0041_CTRL_SURFACE_INFO_INDEX_ATTRS:
		case NV0041_CTRL_SURFACE_INFO_INDEX_COMPR_COVERAGE:
		case NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_ATTR:
			list[i].data = 0;
			break;
		case NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE_LO:
			list[i].data = lower_32_bits(size);
			break;
		case NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE_HI:
			list[i].data = upper_32_bits(size);
			break;
		case NV0041_CTRL_SURFACE_INFO_INDEX_PHYS_SIZE:
			if (size / SZ_4K > U32_MAX)	/* NV_ASSERT_OR_RETURN in RM */
				status = NV_ERR_OUT_OF_RANGE;
			else
				list[i].data = size / SZ_4K;
			break;
		case NV0041_CTRL_SURFACE_INFO_INDEX_ADDR_SPACE_TYPE:
			list[i].data = obj->kind == NVMOCK_VIDMEM ? NV0000_ADDR_SPACE_TYPE_VIDMEM :
				       NV0000_ADDR_SPACE_TYPE_SYSMEM;
			break;
		default:
			status = NV_ERR_INVALID_ARGUMENT;
		}
		if (status != NV_OK)
			break;
	}
	/* The kernel's list is RM's to write in place: the entries before a failure are filled. */
	if (caller->kernel)
		memcpy(klist, list, i * sizeof(list[0]));
	else if (status == NV_OK && copy_to_user(ulist, list, bytes))
		return NV_ERR_INVALID_POINTER;
	return status;
}

/*
 * The commands nvmock models, by the class that exports them. GET_INTERLEAVE_LEVEL is not among
 * them: neither the TSG's 0xa06c0108 nor the channel's 0xa06f0110 is in 580.142's export tables
 * (src/nvidia/generated/g_kernel_channel_group_api_nvoc.c, g_kernel_channel_nvoc.c), so RM
 * answers NV_ERR_NOT_SUPPORTED as for any command a class does not export. Measured on an H100:
 * the TSG's (tests/vm/rmcases.py tsg_timeslice) and the channel's (the doctor's tables, status
 * 0x56) both NV_ERR_NOT_SUPPORTED.
 */
static const struct control_desc control_table[] = {
	{ NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, NVMOCK_TSG,
	  sizeof(struct nva06c_gpfifo_schedule_params), tsg_gpfifo_schedule },
	{ NVA06C_CTRL_CMD_SET_TIMESLICE, NVMOCK_TSG,
	  sizeof(struct nva06c_timeslice_params), tsg_set_timeslice },
	{ NVA06C_CTRL_CMD_GET_TIMESLICE, NVMOCK_TSG,
	  sizeof(struct nva06c_timeslice_params), tsg_get_timeslice },
	{ NVA06C_CTRL_CMD_PREEMPT, NVMOCK_TSG,
	  sizeof(struct nva06c_preempt_params), tsg_preempt },
	{ NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, NVMOCK_TSG,
	  sizeof(struct nva06c_interleave_level_params), tsg_set_interleave },
	{ NVA06F_CTRL_CMD_GPFIFO_SCHEDULE, NVMOCK_CHANNEL,
	  sizeof(struct nva06c_gpfifo_schedule_params), channel_gpfifo_schedule },
	{ NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, NVMOCK_CHANNEL,
	  sizeof(struct nvc36f_work_submit_token_params), channel_work_submit_token },
	{ NV906F_CTRL_GET_CLASS_ENGINEID, NVMOCK_CHANNEL,
	  sizeof(struct nv906f_class_engineid_params), channel_get_class_engineid },
	{ NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST, NVMOCK_DEVICE,
	  sizeof(struct nv0080_channellist_params), device_get_channel_list },
	{ NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE, NVMOCK_SUBDEVICE,
	  sizeof(struct nv2080_ctx_buffer_size_params), subdevice_get_ctx_buffer_size },
	{ NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS, NVMOCK_SUBDEVICE,
	  sizeof(struct nv2080_ecc_status_params), subdevice_query_ecc_status },
	{ NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, NVMOCK_SUBDEVICE,
	  sizeof(struct nv2080_fifo_disable_channels_params), subdevice_disable_channels },
	{ NVA06C_CTRL_CMD_MAKE_REALTIME, NVMOCK_TSG,
	  sizeof(struct nva06c_make_realtime_params), tsg_make_realtime },
	{ NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL, NVMOCK_CHANNEL,
	  sizeof(struct nva06f_interleave_level_params), channel_set_interleave },
	{ NVA06F_CTRL_CMD_RESTART_RUNLIST, NVMOCK_CHANNEL,
	  sizeof(struct nva06f_restart_runlist_params), channel_restart_runlist },
	{ NVA06F_CTRL_CMD_STOP_CHANNEL, NVMOCK_CHANNEL,
	  sizeof(struct nva06f_stop_channel_params), channel_stop },
	{ NV2080_CTRL_CMD_FIFO_RUNLIST_SET_SCHED_POLICY, NVMOCK_SUBDEVICE,
	  sizeof(struct nv2080_runlist_sched_policy_params), subdevice_sched_policy },
	{ NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE, NVMOCK_SUBDEVICE,
	  sizeof(struct nv2080_ctxsw_preemption_mode_params), subdevice_set_ctxsw_preemption },
	{ NV2080_CTRL_CMD_GR_GET_CTXSW_STATS, NVMOCK_SUBDEVICE,
	  sizeof(struct nv2080_ctxsw_stats_params), subdevice_get_ctxsw_stats },
	{ NV2080_CTRL_CMD_GR_GET_CTXSW_MODES, NVMOCK_SUBDEVICE,
	  sizeof(struct nv2080_ctxsw_modes_params), subdevice_get_ctxsw_modes },
	{ NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO, NVMOCK_CLIENT,
	  sizeof(struct nv0000_handle_info_params), client_get_handle_info },
	{ NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES, NVMOCK_CLIENT,
	  sizeof(struct nv0000_objects_are_duplicates_params), client_objects_are_duplicates },
	{ NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, NVMOCK_CLIENT,
	  sizeof(struct nv0000_export_object_to_fd_params), nvmock_export_to_fd },
	{ NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD, NVMOCK_CLIENT,
	  sizeof(struct nv0000_import_object_from_fd_params), nvmock_import_from_fd },
	{ NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD, NVMOCK_CLIENT,
	  sizeof(struct nv0000_export_objects_to_fd_params), nvmock_export_objects_to_fd },
	{ NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD, NVMOCK_CLIENT,
	  sizeof(struct nv0000_import_objects_from_fd_params), nvmock_import_objects_from_fd },
	{ NV0041_CTRL_CMD_GET_SURFACE_INFO, NVMOCK_VIDMEM,
	  sizeof(struct nv0041_surface_info_params), mem_get_surface_info },
	{ NV0041_CTRL_CMD_GET_SURFACE_INFO, NVMOCK_SYSMEM,
	  sizeof(struct nv0041_surface_info_params), mem_get_surface_info },
};

static const struct control_desc *control_of(u32 cmd, enum nvmock_kind kind)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(control_table); i++)
		if (control_table[i].cmd == cmd && control_table[i].kind == kind)
			return &control_table[i];
	return NULL;
}

/*
 * RM_CONTROL. With kernel_params the parameter pointer is a kernel address (the in-kernel
 * entry), used in place; otherwise it is a user address, copied in and out by the control's
 * own size.
 */
u32 nvmock_rm_control(const struct nvmock_caller *caller, struct nvos54_params *p,
		      bool kernel_params)
{
	const struct control_desc *desc;
	struct nvmock_client *client;
	struct nvmock_object *obj;
	void *buf;
	u32 status;

	/* Category 0, index 0 is the NULL command: nothing to do. */
	if ((p->cmd & 0x3FFF) == 0)
		return NV_OK;
	/* No command nvmock models may run at raised IRQL or bypass RM's locks. */
	if (p->flags & (NVOS54_FLAGS_IRQL_RAISED | NVOS54_FLAGS_LOCK_BYPASS))
		return NV_ERR_INVALID_ARGUMENT;
	/* FINN-serialized parameters (serverDeserializeCtrlDown): not modelled. */
	if (p->flags & NVOS54_FLAGS_FINN_SERIALIZED)
		return NV_ERR_NOT_SUPPORTED;
	status = nvmock_caller_client(caller, p->hClient, &client);
	if (status != NV_OK)
		return status;
	/* serverutilGetResourceRef (rs_utils.c); measured: rmcases.py controls, unknown_object. */
	obj = nvmock_object_get(client, p->hObject);
	if (!obj)
		return NV_ERR_OBJECT_NOT_FOUND;
	/* An object RM invalidated with one it depended on (rm.c): serverControl, rs_server.c. */
	if (obj->kind == NVMOCK_INVALID)
		return NV_ERR_RESOURCE_LOST;
	desc = control_of(p->cmd, obj->kind);
	if (!desc)
		return NV_ERR_NOT_SUPPORTED;
	if (p->paramsSize != desc->size)
		return NV_ERR_INVALID_ARGUMENT;
	if (!p->params)
		return NV_ERR_INVALID_ARGUMENT;

	/*
	 * A kernel caller's parameters are used in place (param_copy.c: rmapiParamsAcquire,
	 * bUseParamsDirectly): what a handler wrote stays there whatever the status. A process's
	 * are copied in, and out on success only (rmapiParamsRelease).
	 */
	if (kernel_params)
		return desc->handler(caller, obj, (void *)(uintptr_t)p->params);
	buf = kzalloc(desc->size, GFP_KERNEL);
	if (!buf)
		return NV_ERR_NO_MEMORY;
	if (copy_from_user(buf, u64_to_user_ptr(p->params), desc->size))
		status = NV_ERR_INVALID_POINTER;
	if (status == NV_OK)
		status = desc->handler(caller, obj, buf);
	if (status == NV_OK && copy_to_user(u64_to_user_ptr(p->params), buf, desc->size))
		status = NV_ERR_INVALID_POINTER;
	kfree(buf);
	return status;
}
