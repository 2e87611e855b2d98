// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: the BAR1 aperture through which the CPU reaches video memory.
 *
 * On a GPU a process maps video memory through BAR1, a PCI BAR: nvidia.ko maps the BAR's
 * physical ranges with io_remap_pfn_range and marks the mapping VM_IO | VM_PFNMAP
 * (kernel-open/nvidia/nv-mmap.c: nvidia_mmap_helper), so its PFNs have no struct page and the
 * kernel can only reach them through an ioremap of the bus address. In the VM a real PCI BAR
 * stands in for BAR1: QEMU's ivshmem-plain device (tools/vm/run adds one), whose BAR 2 is plain
 * host RAM. nvmock hands out page-aligned pieces of it as the backing of video memory objects;
 * the engine reads them through one write-combined kernel mapping of the whole BAR, as the GPU
 * reads its own memory, and processes map them with io_remap_pfn_range.
 *
 * Without the device (nvmock loaded outside tools/vm/run), video memory is backed by system RAM
 * as system memory is, and debugfs "bar1" says "absent".
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/genalloc.h>
#include <linux/io.h>
#include <linux/pci.h>
#include <linux/seq_file.h>

#include "nvmock.h"

/* QEMU's ivshmem-plain: Red Hat / Qumranet's vendor ID, its device ID; the memory is BAR 2. */
#define IVSHMEM_VENDOR		0x1af4
#define IVSHMEM_DEVICE		0x1110
#define IVSHMEM_MEM_BAR		2

static struct pci_dev *bar_dev;
static phys_addr_t bar_phys;
static resource_size_t bar_size;
static void *bar_vaddr;
static struct gen_pool *bar_pool;

/**
 * nvmock_bar1_init() - take the ivshmem device's BAR as the GPUs' BAR1 aperture, if there is one
 *
 * Return: 0, with or without the device (absent, video memory is system RAM); a negative errno
 * when the device is there but cannot be used.
 */
int nvmock_bar1_init(void)
{
	struct pci_dev *pdev = pci_get_device(IVSHMEM_VENDOR, IVSHMEM_DEVICE, NULL);
	int err;

	if (!pdev)
		return 0;
	err = pci_enable_device_mem(pdev);
	if (err)
		goto err_put;
	err = pci_request_region(pdev, IVSHMEM_MEM_BAR, "nvmock-bar1");
	if (err)
		goto err_disable;
	bar_phys = pci_resource_start(pdev, IVSHMEM_MEM_BAR);
	bar_size = pci_resource_len(pdev, IVSHMEM_MEM_BAR);
	err = -ENOMEM;
	/* Write-combined, as nvidia.ko maps BAR1 for processes that ask for no caching type. */
	bar_vaddr = memremap(bar_phys, bar_size, MEMREMAP_WC);
	if (!bar_vaddr)
		goto err_release;
	bar_pool = gen_pool_create(PAGE_SHIFT, -1);
	if (!bar_pool)
		goto err_unmap;
	err = gen_pool_add_virt(bar_pool, (unsigned long)bar_vaddr, bar_phys, bar_size, -1);
	if (err)
		goto err_pool;
	bar_dev = pdev;
	pr_info("BAR1 aperture: %pa, %llu MiB (ivshmem %s)\n", &bar_phys,
		(u64)bar_size >> 20, pci_name(pdev));
	return 0;

err_pool:
	gen_pool_destroy(bar_pool);
	bar_pool = NULL;
err_unmap:
	memunmap(bar_vaddr);
	bar_vaddr = NULL;
err_release:
	pci_release_region(pdev, IVSHMEM_MEM_BAR);
err_disable:
	pci_disable_device(pdev);
err_put:
	pci_dev_put(pdev);
	return err;
}

/* Every buffer is freed by now: each holds the module through its file or its object. */
void nvmock_bar1_exit(void)
{
	if (!bar_dev)
		return;
	gen_pool_destroy(bar_pool);
	memunmap(bar_vaddr);
	pci_release_region(bar_dev, IVSHMEM_MEM_BAR);
	pci_disable_device(bar_dev);
	pci_dev_put(bar_dev);
	bar_dev = NULL;
}

bool nvmock_bar1_present(void)
{
	return bar_dev;
}

/**
 * nvmock_bar1_alloc() - a zeroed, page-aligned piece of the aperture
 * @size: bytes, a multiple of the page size
 * @phys: where it is on the bus
 *
 * Return: its kernel address, or NULL when the aperture is absent or full.
 */
void *nvmock_bar1_alloc(size_t size, phys_addr_t *phys)
{
	unsigned long vaddr;

	if (!bar_pool)
		return NULL;
	vaddr = gen_pool_alloc(bar_pool, size);
	if (!vaddr)
		return NULL;
	memset((void *)vaddr, 0, size);
	*phys = gen_pool_virt_to_phys(bar_pool, vaddr);
	return (void *)vaddr;
}

void nvmock_bar1_free(void *vaddr, size_t size)
{
	gen_pool_free(bar_pool, (unsigned long)vaddr, size);
}

void nvmock_bar1_show(struct seq_file *m)
{
	if (!bar_pool) {
		seq_puts(m, "absent\n");
		return;
	}
	seq_printf(m, "phys 0x%llx\nsize %llu\navail %zu\n", (u64)bar_phys, (u64)bar_size,
		   gen_pool_avail(bar_pool));
}
