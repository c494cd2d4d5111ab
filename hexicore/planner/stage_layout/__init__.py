"""Phase 2 of HexiScale (§4.3), one pipeline's stages: TP menus (:mod:`.tp_menus`), the stage
table and a pipeline's layout (:mod:`.stage_table`), exact layer allocation (:mod:`.layers`),
aligned layer ranges (:mod:`.alignment`), phase 2 itself (:mod:`.phase2`), whether a pipeline fits
its devices under its schedule (:mod:`.pipeline_fit`), and the batch split over pipelines
(:mod:`.batch`)."""
