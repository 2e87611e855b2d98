// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: RM_MAP_MEMORY and mmap.
 *
 * As in RM, mapping takes two steps: RM_MAP_MEMORY on the control file attaches a mapping
 * context to another, freshly opened file (one context per file); mmap of that file at offset 0
 * then maps it. System memory maps through /dev/nvidiactl, device memory, USERD and the usermode
 * doorbell window through the GPU's /dev/nvidiaN.
 */
#include <linux/file.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "nvmock.h"

atomic_t nvmock_buffers;
atomic_t nvmock_vmas;

/* Where the mock says a mapping lives on the bus (RM answers a bus address, not a user VA). */
#define NVMOCK_BAR1_BASE	0x40000000000ull
#define NVMOCK_BAR0_BASE	0x30000000000ull

struct nvmock_buf *nvmock_buf_alloc(size_t size)
{
	struct nvmock_buf *buf = kzalloc(sizeof(*buf), GFP_KERNEL);

	if (!buf)
		return NULL;
	buf->size = PAGE_ALIGN(size);
	buf->vaddr = vmalloc_user(buf->size);
	if (!buf->vaddr) {
		kfree(buf);
		return NULL;
	}
	kref_init(&buf->ref);
	atomic_inc(&nvmock_buffers);
	return buf;
}

/* Video memory: a piece of the BAR1 aperture when there is one (bar1.c), else system RAM. */
struct nvmock_buf *nvmock_buf_alloc_vidmem(size_t size)
{
	struct nvmock_buf *buf;

	if (!nvmock_bar1_present())
		return nvmock_buf_alloc(size);
	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return NULL;
	buf->size = PAGE_ALIGN(size);
	buf->vaddr = nvmock_bar1_alloc(buf->size, &buf->phys);
	if (!buf->vaddr) {
		kfree(buf);
		return NULL;
	}
	buf->bar1 = true;
	kref_init(&buf->ref);
	atomic_inc(&nvmock_buffers);
	return buf;
}

/**
 * nvmock_mem_back() - give a memory object its backing, on first use
 * @mem_obj: a system or video memory object
 *
 * Context: nvmock_lock held.
 * Return: NV_OK, or why it cannot be backed.
 */
u32 nvmock_mem_back(struct nvmock_object *mem_obj)
{
	struct nvmock_mem *mem = mem_obj->mem;

	if (mem->buf)
		return NV_OK;
	if (mem->size > NVMOCK_MAX_BACKED_BYTES)
		return NV_ERR_INSUFFICIENT_RESOURCES;
	mem->buf = mem_obj->kind == NVMOCK_VIDMEM ? nvmock_buf_alloc_vidmem(mem->size) :
						   nvmock_buf_alloc(mem->size);
	return mem->buf ? NV_OK : NV_ERR_NO_MEMORY;
}

static void buf_release(struct kref *ref)
{
	struct nvmock_buf *buf = container_of(ref, struct nvmock_buf, ref);

	if (buf->bar1)
		nvmock_bar1_free(buf->vaddr, buf->size);
	else
		vfree(buf->vaddr);
	kfree(buf);
	atomic_dec(&nvmock_buffers);
}

void nvmock_buf_put(struct nvmock_buf *buf)
{
	kref_put(&buf->ref, buf_release);
}

void nvmock_map_release(struct nvmock_file *nf)
{
	struct nvmock_map_ctx *map = &nf->map;

	if (map->buf)
		nvmock_buf_put(map->buf);
	if (map->page)
		put_page(map->page);
	memset(map, 0, sizeof(*map));
}

static u32 target_of(struct nvmock_object *mem_obj, struct nvmock_file *target,
		     struct nvmock_map_ctx *ctx, u64 *bus)
{
	u32 status;

	switch (mem_obj->kind) {
	case NVMOCK_SYSMEM:
		if (target->gpu)
			return NV_ERR_INVALID_ARGUMENT;	/* system memory maps through nvidiactl */
		break;
	case NVMOCK_VIDMEM:
	case NVMOCK_USERMODE:
	case NVMOCK_CHANNEL:
		if (target->gpu != mem_obj->gpu)
			return NV_ERR_INVALID_ARGUMENT;	/* BAR mappings: that GPU's file */
		break;
	default:
		return NV_ERR_INVALID_OBJECT_HANDLE;
	}
	ctx->kind = mem_obj->kind;
	switch (mem_obj->kind) {
	case NVMOCK_USERMODE:
		if (ctx->offset + ctx->length > NVRM_USERMODE_SIZE)
			return NV_ERR_INVALID_ARGUMENT;
		ctx->page = mem_obj->gpu->usermode_page;
		*bus = NVMOCK_BAR0_BASE + 0xBB0000 + ctx->offset;
		return NV_OK;
	case NVMOCK_CHANNEL:
		/*
		 * A channel whose USERD the client supplied is not mappable: kchannelMap_IMPL
		 * (kernel_channel.c) asserts !bClientAllocatedUserD, NV_ERR_INVALID_REQUEST.
		 */
		if (!mem_obj->channel->userd_page)
			return NV_ERR_INVALID_REQUEST;
		if (ctx->offset + ctx->length > PAGE_SIZE)
			return NV_ERR_INVALID_ARGUMENT;
		ctx->page = mem_obj->channel->userd_page;
		*bus = NVMOCK_BAR1_BASE + ((u64)mem_obj->channel->chid << PAGE_SHIFT);
		return NV_OK;
	default:
		break;
	}
	if (ctx->offset > mem_obj->mem->size || ctx->length > mem_obj->mem->size - ctx->offset)
		return NV_ERR_INVALID_ARGUMENT;
	status = nvmock_mem_back(mem_obj);
	if (status != NV_OK)
		return status;
	ctx->buf = mem_obj->mem->buf;
	*bus = NVMOCK_BAR1_BASE + (mem_obj->mem->va - NVMOCK_GPU_VA_BASE) + ctx->offset;
	return NV_OK;
}

/*
 * nv_get_file_private (kernel-open/nvidia/nv.c): the file an fd names, if it is the control node
 * (@ctl) or a GPU node (!@ctl), with a reference left in *@os_private for
 * nv_put_file_private(); NULL otherwise. By the driver's name and arguments, and not inlined: qgpu
 * probes it to learn which file RM took a mapping's fd for (rmprobe.c).
 */
noinline struct nvmock_file *nv_get_file_private(s32 fd, bool ctl, void **os_private)
{
	struct file *file = fget(fd);

	if (!file)
		return NULL;
	if (file->f_op == &nvmock_fops && !nvmock_file_of(file)->gpu == ctl) {
		*os_private = file;
		return nvmock_file_of(file);
	}
	fput(file);
	return NULL;
}

noinline void nv_put_file_private(void *os_private)
{
	fput(os_private);
}

/*
 * NV_ESC_RM_MAP_MEMORY, on the control file; attaches a mapping context to p->fd's file: as
 * nv_add_mapping_context_to_file (kernel-open/nvidia/nv-usermap.c), looked up once, through
 * nv_get_file_private() (system memory maps through the control node, the rest through a GPU's).
 */
u32 nvmock_map_memory(struct file *ctl, struct nvos33_params_with_fd *p)
{
	struct nvmock_caller caller = { .file = ctl };
	struct nvmock_map_ctx ctx = { .offset = p->offset, .length = p->length };
	struct nvmock_object *dev, *mem_obj;
	struct nvmock_client *client;
	struct nvmock_file *target;
	void *priv = NULL;
	u64 bus = 0;
	u32 status;

	if (!p->length || p->offset & ~PAGE_MASK)
		return NV_ERR_INVALID_ARGUMENT;
	status = nvmock_caller_client(&caller, p->hClient, &client);
	if (status != NV_OK)
		return status;
	/* Only the process that allocated a client maps its memory. */
	if (client->tgid != current->tgid)
		return NV_ERR_INVALID_CLIENT;
	dev = nvmock_object_get(client, p->hDevice);
	if (!dev || (dev->kind != NVMOCK_DEVICE && dev->kind != NVMOCK_SUBDEVICE))
		return NV_ERR_INVALID_OBJECT_HANDLE;
	mem_obj = nvmock_object_get(client, p->hMemory);
	if (!mem_obj || mem_obj->gpu != dev->gpu)
		return NV_ERR_INVALID_OBJECT_HANDLE;

	target = nv_get_file_private(p->fd, mem_obj->kind == NVMOCK_SYSMEM, &priv);
	if (!target)
		return NV_ERR_INVALID_ARGUMENT;
	if (target->map.set) {
		status = NV_ERR_STATE_IN_USE;
		goto out;
	}
	status = target_of(mem_obj, target, &ctx, &bus);
	if (status != NV_OK)
		goto out;
	if (ctx.buf)
		kref_get(&ctx.buf->ref);
	if (ctx.page)
		get_page(ctx.page);
	ctx.set = true;
	target->map = ctx;
	p->pLinearAddress = bus;
out:
	nv_put_file_private(priv);
	return status;
}

static void vma_open(struct vm_area_struct *vma)
{
	struct nvmock_buf *buf = vma->vm_private_data;

	if (buf)
		kref_get(&buf->ref);
	atomic_inc(&nvmock_vmas);
}

static void vma_close(struct vm_area_struct *vma)
{
	struct nvmock_buf *buf = vma->vm_private_data;

	if (buf)
		nvmock_buf_put(buf);
	atomic_dec(&nvmock_vmas);
}

static const struct vm_operations_struct nvmock_vm_ops = {
	.open = vma_open,
	.close = vma_close,
};

int nvmock_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct nvmock_file *nf = nvmock_file_of(file);
	unsigned long size = vma->vm_end - vma->vm_start;
	struct nvmock_map_ctx ctx;
	int err;

	if (vma->vm_pgoff)
		return -EINVAL;
	mutex_lock(&nvmock_lock);
	ctx = nf->map;
	if (ctx.buf)
		kref_get(&ctx.buf->ref);
	mutex_unlock(&nvmock_lock);
	if (!ctx.set)
		return -EINVAL;
	/* A GPU file's mapping is exactly its context; nvidiactl takes up to it. */
	if ((nf->gpu && size != PAGE_ALIGN(ctx.length)) || size > PAGE_ALIGN(ctx.length)) {
		err = -ENXIO;
		goto err_put;
	}
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	if (ctx.page) {
		/* One page (USERD, or the doorbell window's first page, repeated). */
		unsigned long addr;

		for (addr = vma->vm_start; addr < vma->vm_end; addr += PAGE_SIZE) {
			err = vm_insert_page(vma, addr, ctx.page);
			if (err)
				goto err_put;
		}
		vma->vm_private_data = NULL;
	} else if (ctx.buf->bar1) {
		/*
		 * Video memory through BAR1: I/O memory, VM_IO | VM_PFNMAP and no struct page, as
		 * nvidia_mmap_helper (kernel-open/nvidia/nv-mmap.c) maps it with
		 * nv_io_remap_page_range.
		 */
		vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
		err = io_remap_pfn_range(vma, vma->vm_start,
					 (ctx.buf->phys + ctx.offset) >> PAGE_SHIFT, size,
					 vma->vm_page_prot);
		if (err)
			goto err_put;
		vma->vm_private_data = ctx.buf;	/* the reference taken above */
	} else {
		err = remap_vmalloc_range(vma, ctx.buf->vaddr, ctx.offset >> PAGE_SHIFT);
		if (err)
			goto err_put;
		vma->vm_private_data = ctx.buf;	/* the reference taken above */
	}
	vma->vm_ops = &nvmock_vm_ops;
	atomic_inc(&nvmock_vmas);
	return 0;

err_put:
	if (ctx.buf)
		nvmock_buf_put(ctx.buf);
	return err;
}
