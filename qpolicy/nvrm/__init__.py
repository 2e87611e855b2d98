"""NVIDIA RM traffic: the ABI facts (:mod:`.abi`), decoding one ioctl (:mod:`.decode`), trace
records (:mod:`.records`) and the per-process object tracker (:mod:`.tracker`)."""
