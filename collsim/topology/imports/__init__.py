"""Describe a real cluster from what the cluster reports about itself.

``collsim topo import`` reads what a machine already knows: the system NCCL detected
(``NCCL_TOPO_DUMP_FILE``, :mod:`.ncclxml`), the GPU/NIC affinity matrix of ``nvidia-smi topo -m``
(:mod:`.nvsmi`) and the InfiniBand fabric as ``ibnetdiscover`` lists it (:mod:`.ibnet`). Each
reader turns its input into one plain description of a server, an :class:`.inventory.Inventory`
(and a :class:`.ibnet.FabricScan` for the fabric); :mod:`.build` writes that out as an ordinary
topology file (a template where the template rules say the same thing, an explicit graph where
they cannot), so ``topo show`` and ``simulate`` read it like any catalog entry.
"""
