"""Phase 1 of HexiScale (§4.2): the devices cut into one part per pipeline — the partitioner,
refiner and stage-orderer interfaces with their graph-cut helpers (:mod:`.cut`) and the split
itself (:mod:`.phase1`)."""
