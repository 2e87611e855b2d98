// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: the simulated engine of one GPU.
 *
 * A kernel thread plays the GPU's scheduler: it round-robins the TSGs that have runnable work,
 * giving each its timeslice (1024 us unless SET_TIMESLICE said otherwise) and paying a context
 * switch whenever the TSG changes. A channel is runnable while it is enabled (not stopped by
 * FIFO_DISABLE_CHANNELS), scheduled, and has work: GP_GET short of the GP_PUT its process wrote
 * in USERD, or a RUN_US still running. Running means sleeping in real time, in chunks short
 * enough that a disabled channel stops at once; the time is charged to the TSG, its channel and
 * its process, which is the ground truth tests read in debugfs.
 */
#include <linux/cpumask.h>
#include <linux/delay.h>
#include <linux/kthread.h>
#include <linux/ktime.h>
#include <linux/moduleparam.h>
#include <linux/sched.h>
#include <linux/sizes.h>

#include "nvmock.h"

static unsigned int switch_us = 150;
module_param(switch_us, uint, 0644);
MODULE_PARM_DESC(switch_us, "Context switch between TSGs, us");

static unsigned int chunk_us = 200;
module_param(chunk_us, uint, 0644);
MODULE_PARM_DESC(chunk_us, "Longest stretch the engine runs without looking at channel state, us");

static unsigned int idle_poll_us = 200;
module_param(idle_poll_us, uint, 0644);
MODULE_PARM_DESC(idle_poll_us, "How often an idle engine looks for work, us");

/*
 * The engine stands for a GPU, which runs beside the host's CPUs and never waits for them. As an
 * ordinary thread in a VM of one vCPU it waited for every real-time thread of the host: qgpu's
 * scheduler (SCHED_FIFO) spins through each GSP control as RM does (control.c), so at every close
 * and open the mock GPU could not wake for 0.4-0.5 ms, and a kernel due to end then ended late. Run
 * above every such thread, it sleeps through its kernels and wakes when they end. Measured in the
 * VM of one vCPU, CUDA's tree, five alternating pairs of 1 001 requests at 50 Hz beside a trainer
 * (tools/bench/qgpu_vm_ab.py with PARAM=nvmock.engine_fifo; BENCHMARKS.md 2026-12-05, fortieth
 * session): qgpu's online p50 / p99 2.88 / 3.92 ms as an ordinary thread, 2.69 / 3.61 in
 * SCHED_FIFO, against a solo of 2.36-2.40 / 2.79-3.01. 0 makes it an ordinary thread again, for
 * that comparison.
 */
static bool engine_fifo = true;
module_param(engine_fifo, bool, 0644);
MODULE_PARM_DESC(engine_fifo, "The engine's thread runs SCHED_FIFO, above host threads (default 1)");

/*
 * The engine's thread keeps to the last online CPU. In SCHED_FIFO it preempts whatever runs
 * where it wakes, about 2 400 times a second when idle, and the real-time balancer then pushes
 * qgpu's scheduler thread (SCHED_FIFO too, lower) to the other CPU: in the VM of two vCPUs it
 * was moved 1 300-1 700 times a second, its CPU time per pass doubled, and it made 3 320-3 590
 * passes in 2 s where it made 4 230-4 390 with the engine an ordinary thread and 4 650-4 770 with
 * the engine kept to one CPU (BENCHMARKS.md 2026-12-05, forty-second session). A GPU takes no host
 * CPU and moves no host thread; kept to one CPU, the engine leaves qgpu's thread settled on the
 * other. 0 lets it run anywhere again, for comparison. In a VM of one vCPU it changes nothing.
 */
static bool engine_pin = true;
module_param(engine_pin, bool, 0644);
MODULE_PARM_DESC(engine_pin, "The engine's thread keeps to the last online CPU (default 1)");

/* Methods decoded in one go under the lock before yielding. */
#define METHODS_PER_FETCH	256

void nvmock_engine_add_tsg(struct nvmock_tsg *tsg)
{
	struct nvmock_engine *engine = &tsg->gpu->engine;

	spin_lock(&engine->lock);
	list_add_tail(&tsg->runlist_node, &engine->runlist);
	spin_unlock(&engine->lock);
}

void nvmock_engine_remove_tsg(struct nvmock_tsg *tsg)
{
	struct nvmock_engine *engine = &tsg->gpu->engine;

	spin_lock(&engine->lock);
	tsg->gone = true;
	list_del(&tsg->runlist_node);
	if (engine->last == tsg)
		engine->last = NULL;
	spin_unlock(&engine->lock);
	/* The engine may be switching to it right now, outside the lock. */
	wait_event(engine->released, READ_ONCE(engine->pinned) != tsg);
}

void nvmock_engine_add_channel(struct nvmock_channel *ch)
{
	struct nvmock_engine *engine = &ch->gpu->engine;

	spin_lock(&engine->lock);
	list_add_tail(&ch->tsg_node, &ch->tsg->channels);
	spin_unlock(&engine->lock);
}

void nvmock_engine_remove_channel(struct nvmock_channel *ch)
{
	struct nvmock_engine *engine = &ch->gpu->engine;

	spin_lock(&engine->lock);
	ch->gone = true;
	list_del(&ch->tsg_node);
	if (ch->tsg->next_channel == ch)
		ch->tsg->next_channel = NULL;
	spin_unlock(&engine->lock);
	wait_event(engine->released, READ_ONCE(engine->running) != ch);
}

/*
 * Give mem the lowest free GPU address it fits at, keeping va_list in address order. Freed
 * ranges are reused, as RM's own allocator does: a process that allocates and frees for
 * hours must not walk past the 40 address bits a GPFIFO entry carries.
 */
bool nvmock_engine_add_mem(struct nvmock_gpu *gpu, struct nvmock_mem *mem)
{
	u64 span = round_up(mem->size, SZ_64K);
	struct list_head *next = &gpu->va_list;
	u64 va = NVMOCK_GPU_VA_BASE;
	struct nvmock_mem *pos;
	bool placed = false;

	spin_lock(&gpu->engine.lock);
	list_for_each_entry(pos, &gpu->va_list, va_node) {
		if (pos->va - va >= span) {
			next = &pos->va_node;
			break;
		}
		va = pos->va + round_up(pos->size, SZ_64K);
	}
	if (span <= NVMOCK_GPU_VA_END - va) {
		mem->va = va;
		list_add_tail(&mem->va_node, next);
		placed = true;
	}
	spin_unlock(&gpu->engine.lock);
	return placed;
}

void nvmock_engine_remove_mem(struct nvmock_gpu *gpu, struct nvmock_mem *mem)
{
	spin_lock(&gpu->engine.lock);
	list_del(&mem->va_node);
	spin_unlock(&gpu->engine.lock);
}

void nvmock_engine_reset_stats(struct nvmock_gpu *gpu)
{
	struct nvmock_engine *engine = &gpu->engine;
	struct nvmock_tsg *tsg;

	spin_lock(&engine->lock);
	engine->switches = 0;
	engine->switch_ns = 0;
	memset(engine->switch_over, 0, sizeof(engine->switch_over));
	engine->busy_ns = 0;
	memset(engine->processes, 0, sizeof(engine->processes));
	list_for_each_entry(tsg, &engine->runlist, runlist_node)
		tsg->gpu_ns = 0;
	spin_unlock(&engine->lock);
}

/* The kernel address of [va, va + len) in a backed memory object of the GPU, or NULL. */
static void *kernel_address(struct nvmock_gpu *gpu, u64 va, size_t len)
{
	struct nvmock_mem *mem;

	list_for_each_entry(mem, &gpu->va_list, va_node) {
		if (va < mem->va || va - mem->va >= mem->size)
			continue;
		if (!mem->buf || len > mem->buf->size || va - mem->va > mem->buf->size - len)
			return NULL;
		return mem->buf->vaddr + (va - mem->va);
	}
	return NULL;
}

static u32 gp_put(const struct nvmock_channel *ch)
{
	return READ_ONCE(ch->userd[NVRM_USERD_GP_PUT / 4]) & (ch->entries - 1);
}

/*
 * Enabled, or disabled with bOnlyDisableScheduling while its TSG was on the engine: that leaves
 * it the work it has started, to its end or to the end of the slice where another TSG has work
 * (FIFO_DISABLE_CHANNELS in control.c; channel_fetch()).
 */
static bool channel_may_run(const struct nvmock_channel *ch)
{
	return (nvmock_channel_enabled(ch) && !ch->stalled) || ch->finish_slice;
}

/**
 * nvmock_channel_queued() - whether @ch has GPFIFO entries its engine has not fetched yet
 * @ch: the channel, under its engine's lock
 *
 * Return: true where GP_PUT, as its process wrote it, is ahead of GP_GET.
 */
bool nvmock_channel_queued(const struct nvmock_channel *ch)
{
	return ch->gp_get != gp_put(ch);
}

static bool channel_runnable(const struct nvmock_channel *ch)
{
	if (!channel_may_run(ch) || !ch->scheduled || ch->faulted)
		return false;
	return ch->run_left_ns || ch->in_segment || ch->gp_get != gp_put(ch);
}

static void channel_fault(struct nvmock_channel *ch)
{
	/* A real GPU raises a channel error and stops the channel; so does the mock. */
	ch->faulted = true;
	ch->run_left_ns = 0;
	ch->in_segment = false;
}

static void run_method(struct nvmock_channel *ch, u32 method, u32 data)
{
	u64 ahead;
	u32 *sem;

	switch (method) {
	case NVMOCK_METHOD_RUN_US:
		ch->run_left_ns = (u64)data * NSEC_PER_USEC;
		ahead = min(ch->ahead_ns, ch->run_left_ns);
		ch->run_left_ns -= ahead;
		ch->ahead_ns -= ahead;
		break;
	case NVMOCK_METHOD_SEM_ADDR_LO:
		ch->sem_va = (ch->sem_va & ~0xFFFFFFFFull) | data;
		break;
	case NVMOCK_METHOD_SEM_ADDR_HI:
		ch->sem_va = (ch->sem_va & 0xFFFFFFFFull) | ((u64)data << 32);
		break;
	case NVMOCK_METHOD_SEM_RELEASE:
		sem = kernel_address(ch->gpu, ch->sem_va, sizeof(*sem));
		if (!sem || ch->sem_va & 3) {
			channel_fault(ch);
			break;
		}
		smp_wmb();	/* everything before the release is visible first */
		WRITE_ONCE(*sem, data);
		break;
	default:
		break;	/* methods of the real classes: nothing to simulate */
	}
}

/*
 * Decode the channel's methods up to the next RUN_US; true when it has something to run.
 * Called with the engine lock held.
 */
static bool channel_fetch(struct nvmock_channel *ch)
{
	unsigned int budget = METHODS_PER_FETCH;
	u32 *words;

	while (budget--) {
		if (ch->run_left_ns)
			return true;
		if (!channel_may_run(ch) || ch->faulted)
			return false;
		if (!ch->in_segment) {
			/*
			 * Closed with bOnlyDisableScheduling: a trainer alone on an H200
			 * finished the kernel it ran (a 0.1 s one 62-83 ms after the call) and
			 * ran no other, neither those submitted after the close (call 21B) nor
			 * those queued before it (21E: no batch of four finished). A stalled
			 * channel (control.c) fetches none either, opened before it left the
			 * engine.
			 */
			if (!nvmock_channel_enabled(ch) || ch->stalled)
				return false;
			if (ch->gp_get == gp_put(ch)) {
				ch->ahead_ns = 0;	/* idle: no credit survives a gap */
				return false;
			}
			words = kernel_address(ch->gpu, ch->gpfifo_va + (u64)ch->gp_get *
					       NVRM_GP_ENTRY_SIZE, NVRM_GP_ENTRY_SIZE);
			if (!words) {
				channel_fault(ch);
				return false;
			}
			ch->seg_va = (words[0] & ~3u) | ((u64)(words[1] & 0xFF) << 32);
			ch->seg_words = (words[1] >> NVRM_GP_ENTRY1_LENGTH_SHIFT) &
					NVRM_GP_ENTRY1_LENGTH_MASK;
			ch->seg_pos = 0;
			ch->in_segment = true;
			/*
			 * The host's GPFIFO fetcher moves GP_GET past an entry when it fetches
			 * it, not when its work is done: a long kernel reads GP_GET == GP_PUT
			 * while it runs (CONFORMANCE.md, the engine).
			 */
			ch->gp_get = (ch->gp_get + 1) & (ch->entries - 1);
			WRITE_ONCE(ch->userd[NVRM_USERD_GP_GET / 4], ch->gp_get);
		}
		if (ch->seg_words - ch->seg_pos < 2) {
			ch->in_segment = false;	/* segment done */
			continue;
		}
		words = kernel_address(ch->gpu, ch->seg_va + (u64)ch->seg_pos * 4, 8);
		if (!words) {
			channel_fault(ch);
			return false;
		}
		ch->seg_pos += 2;
		run_method(ch, words[0], words[1]);
	}
	return true;	/* more to decode: come back */
}

static bool tsg_runnable(struct nvmock_tsg *tsg)
{
	struct nvmock_channel *ch;

	list_for_each_entry(ch, &tsg->channels, tsg_node)
		if (channel_runnable(ch))
			return true;
	return false;
}

/* Round robin from the TSG after the one that ran last. */
static struct nvmock_tsg *pick_tsg(struct nvmock_engine *engine)
{
	struct nvmock_tsg *tsg, *start = engine->last;

	if (start) {
		tsg = start;
		list_for_each_entry_continue(tsg, &engine->runlist, runlist_node)
			if (tsg_runnable(tsg))
				return tsg;
	}
	list_for_each_entry(tsg, &engine->runlist, runlist_node) {
		if (tsg_runnable(tsg))
			return tsg;
		if (tsg == start)
			break;
	}
	return NULL;
}

/* The next channel of the TSG with something to run, round robin inside the TSG. */
static struct nvmock_channel *pick_channel(struct nvmock_tsg *tsg)
{
	struct nvmock_channel *ch, *first = NULL;
	bool passed = !tsg->next_channel;

	list_for_each_entry(ch, &tsg->channels, tsg_node) {
		if (ch == tsg->next_channel)
			passed = true;
		if (!channel_runnable(ch) || !channel_fetch(ch))
			continue;
		if (passed) {
			tsg->next_channel = ch;
			return ch;
		}
		if (!first)
			first = ch;
	}
	tsg->next_channel = first;
	return first;
}

static void charge_process(struct nvmock_engine *engine, pid_t tgid, u64 ns)
{
	struct nvmock_process *slot = NULL;
	int i;

	for (i = 0; i < NVMOCK_MAX_PROCESSES; i++) {
		struct nvmock_process *p = &engine->processes[i];

		if (p->tgid == tgid) {
			p->gpu_ns += ns;
			return;
		}
		if (!slot && !p->tgid)
			slot = p;
	}
	if (!slot)
		slot = &engine->processes[tgid % NVMOCK_MAX_PROCESSES];
	slot->tgid = tgid;
	slot->gpu_ns = ns;
}

/* Sleep about ns of real time, outside the lock; returns what really passed. */
static u64 spend(u64 ns)
{
	ktime_t start = ktime_get();
	unsigned long us = max_t(u64, ns / NSEC_PER_USEC, 1);

	usleep_range(us, us + us / 8 + 5);
	return ktime_to_ns(ktime_sub(ktime_get(), start));
}

/* A switch's last stretch, spun through on time; what comes before it is slept. */
#define SPIN_TAIL_US	1000

/*
 * Let ns of real time pass, on time. A context switch must end on time: a sleep of 150 us in
 * the VM overshoots by about 500 us, which no TSG would get back, so every switch cost more
 * than four times switch_us (measured, 2026-11-27: 801 switches took 0.548 s). So the last
 * SPIN_TAIL_US are spun through, holding the CPU. What comes before them is slept, since a GPU's
 * switch takes none of the host's CPU and the engine's thread, in SCHED_FIFO, would hold the
 * vCPU of the VM's timed tests from every other thread for as long as it spun: any switch_us
 * root writes stays harmless to the rest of the machine, and unloading cuts it short. Returns
 * what passed, as spend() does.
 */
static u64 spin(u64 ns)
{
	ktime_t start = ktime_get(), now = start, end = ktime_add_ns(start, ns);

	while (ktime_before(now, end) && !kthread_should_stop()) {
		s64 left_us = ktime_us_delta(end, now);

		if (left_us > SPIN_TAIL_US)
			usleep_range(left_us - SPIN_TAIL_US, left_us - SPIN_TAIL_US / 2);
		else
			cpu_relax();
		now = ktime_get();
	}
	return ktime_to_ns(ktime_sub(now, start));
}

/*
 * A switch's overshoot past switch_us by decade, 10 us up: a spin ends within the first, a
 * sleep's timer slack and wake-up land in the next, a host that takes the vCPU in the last.
 */
static unsigned int over_bin(u64 over_ns)
{
	unsigned int bin = 0;
	u64 bound = 10 * NSEC_PER_USEC;

	while (bin < NVMOCK_SWITCH_OVER_BINS - 1 && over_ns >= bound) {
		bin++;
		bound *= 10;
	}
	return bin;
}

/* Whether a TSG other than tsg has work: the only thing the hardware switches away for. */
static bool other_runnable(struct nvmock_engine *engine, struct nvmock_tsg *tsg)
{
	struct nvmock_tsg *other;

	lockdep_assert_held(&engine->lock);
	list_for_each_entry(other, &engine->runlist, runlist_node)
		if (other != tsg && tsg_runnable(other))
			return true;
	return false;
}

/*
 * GR's saves of a TSG's context (GR_GET_CTXSW_STATS, control.c), as measured on an H100 and an
 * H200 (tools/gpu/ctxsw_saves.py; CONFORMANCE.md, the engine): a TSG taken off the engine with
 * work in flight, its slice over beside another TSG with work or its channels stopped by
 * FIFO_DISABLE_CHANNELS, is saved once, by CILP; one switched out with nothing to run is saved
 * by wait-for-idle when another TSG's context is loaded (engine_thread()); a context never
 * switched out is never saved, however often it idles or is closed with nothing to run.
 *
 * Work in flight is a kernel unfinished or one queued behind it: the host fetches a channel's
 * GPFIFO ahead of its engine, so on a GPU the next kernel has started by the time the last one
 * ends (side by side at a 1 us timeslice, the H100's and H200's 8192 trainer, 1.4 ms kernels,
 * were saved by CILP every time, 4 007 and 4 245 saves). The mock fetches a kernel only when
 * the TSG runs, so a slice that overshoots to its kernel's end finds the next one unfetched;
 * counting that as idle had a TSG of 1 ms kernels WFI-saved four times in five beside another at
 * 1 us in the VM, and in one CI run a loop of 40 ms kernels, two queued, at all 1 914 switches.
 */
static bool work_in_flight(const struct nvmock_tsg *tsg)
{
	const struct nvmock_channel *ch;

	list_for_each_entry(ch, &tsg->channels, tsg_node)
		if (!ch->faulted && (ch->run_left_ns || ch->in_segment || ch->gp_get != gp_put(ch)))
			return true;
	return false;
}

static void taken_off(struct nvmock_engine *engine, struct nvmock_tsg *tsg)
{
	lockdep_assert_held(&engine->lock);
	if (tsg->gone || tsg->saved || !work_in_flight(tsg))
		return;
	tsg->saves++;
	tsg->cilp_saves++;
	tsg->saved = true;
}

static void switched_out(struct nvmock_engine *engine, struct nvmock_tsg *tsg)
{
	lockdep_assert_held(&engine->lock);
	if (tsg->saved)
		return;
	tsg->saves++;
	tsg->wfi_saves++;
	tsg->saved = true;
}

static void run_slice(struct nvmock_engine *engine, struct nvmock_tsg *tsg)
{
	/* RM keeps any timeslice (control.c); the engine runs between 1 us and 1000 s. */
	s64 slice = (s64)clamp_t(u64, tsg->timeslice_us, 1, 1000000000ull) * NSEC_PER_USEC;
	bool idle = false;
	ktime_t mark;
	s64 left;

	/*
	 * Sleeps overshoot, in a VM by a lot; what a slice ran over comes off the TSG's next ones
	 * (a whole turn if need be), so that over time each TSG gets its timeslice exactly, as from
	 * the hardware's timer. A TSG alone with work owes nothing, and its slice renews where it
	 * ends: the hardware switches only to another TSG with work (measured: a trainer under a
	 * 1 us timeslice keeps its native throughput, CONFORMANCE.md, the engine).
	 */
	if (!other_runnable(engine, tsg))
		tsg->overrun_ns = 0;
	left = slice - tsg->overrun_ns;
	if (left <= 0) {
		tsg->overrun_ns = -left;
		return;
	}
	mark = ktime_get();
	while (!tsg->gone && !kthread_should_stop()) {
		struct nvmock_channel *ch;
		u64 chunk, spent;
		ktime_t now;

		if (left <= 0) {
			if (other_runnable(engine, tsg))
				break;
			left = slice;
		}
		ch = pick_channel(tsg);
		if (!ch) {
			idle = true;
			break;
		}
		chunk = min3(ch->run_left_ns, (u64)left, (u64)chunk_us * NSEC_PER_USEC);
		engine->running = ch;
		spin_unlock(&engine->lock);
		spend(chunk);
		spin_lock(&engine->lock);
		/*
		 * The TSG held the engine from the last mark, the mock's own bookkeeping between
		 * chunks included: a GPU has no such gaps, so they are the TSG's time, not lost.
		 */
		now = ktime_get();
		spent = ktime_to_ns(ktime_sub(now, mark));
		mark = now;
		/*
		 * ch is alive until running moves on: its freer waits for that. Time past the end
		 * of the kernel is not lost: the channel's next kernels have had it.
		 */
		if (spent > ch->run_left_ns)
			ch->ahead_ns += spent - ch->run_left_ns;
		ch->run_left_ns -= min(ch->run_left_ns, spent);
		ch->gpu_ns += spent;
		tsg->gpu_ns += spent;
		engine->busy_ns += spent;
		charge_process(engine, tsg->tgid, spent);
		WRITE_ONCE(engine->running, NULL);
		wake_up_all(&engine->released);
		left -= spent;
	}
	/* Overrun only counts while the TSG had work to the end; an idle TSG owes nothing. */
	tsg->overrun_ns = left < 0 && !idle ? -left : 0;
}

static int engine_thread(void *data)
{
	struct nvmock_gpu *gpu = data;
	struct nvmock_engine *engine = &gpu->engine;
	bool fifo = false, pinned = false;

	while (!kthread_should_stop()) {
		struct nvmock_tsg *tsg;

		if (READ_ONCE(engine_fifo) != fifo) {
			fifo = !fifo;
			if (fifo)
				sched_set_fifo(current);
			else
				sched_set_normal(current, 0);
		}
		/* Only on a change, so that a test may still place the thread itself. */
		if (READ_ONCE(engine_pin) != pinned &&
		    !set_cpus_allowed_ptr(current, !pinned ?
					  cpumask_of(cpumask_last(cpu_online_mask)) :
					  cpu_possible_mask))
			pinned = !pinned;
		spin_lock(&engine->lock);
		tsg = pick_tsg(engine);
		if (!tsg) {
			spin_unlock(&engine->lock);
			usleep_range(idle_poll_us, idle_poll_us + idle_poll_us / 4 + 10);
			continue;
		}
		engine->pinned = tsg;
		if (engine->last && engine->last != tsg)
			switched_out(engine, engine->last);
		if (engine->last && engine->last != tsg && switch_us) {
			u64 target = (u64)switch_us * NSEC_PER_USEC, took;

			engine->switches++;
			spin_unlock(&engine->lock);
			took = spin(target);
			spin_lock(&engine->lock);
			engine->switch_ns += took;
			/*
			 * By overshoot, so a test can tell a switch that overran (a sleep's
			 * overshoot hits every one) from a host that took the vCPU now and then.
			 */
			engine->switch_over[over_bin(took - min(took, target))]++;
		}
		if (!tsg->gone) {
			struct nvmock_channel *ch;

			if (tsg->saved) {
				tsg->restores++;
				tsg->saved = false;
			}
			engine->last = tsg;
			run_slice(engine, tsg);
			taken_off(engine, tsg);
			/* Off the engine: what was only unscheduled is now stopped too. */
			if (!tsg->gone)
				list_for_each_entry(ch, &tsg->channels, tsg_node)
					ch->finish_slice = false;
		}
		WRITE_ONCE(engine->pinned, NULL);
		wake_up_all(&engine->released);
		spin_unlock(&engine->lock);
		cond_resched();
	}
	return 0;
}

int nvmock_engine_start(struct nvmock_gpu *gpu)
{
	struct nvmock_engine *engine = &gpu->engine;
	struct task_struct *thread;

	spin_lock_init(&engine->lock);
	INIT_LIST_HEAD(&engine->runlist);
	init_waitqueue_head(&engine->released);
	thread = kthread_run(engine_thread, gpu, "nvmock-gpu%u", gpu->index);
	if (IS_ERR(thread))
		return PTR_ERR(thread);
	engine->thread = thread;
	return 0;
}

void nvmock_engine_stop(struct nvmock_gpu *gpu)
{
	if (gpu->engine.thread)
		kthread_stop(gpu->engine.thread);
	gpu->engine.thread = NULL;
}
