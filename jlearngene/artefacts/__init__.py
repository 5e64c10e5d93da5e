"""Genes as files: every method's gene as one directory (`gene_file`), the descendants it
can make (`descendants`), and genes and descendants as model checkpoints (`checkpoints`).

The names below are the package's API: `artefacts.save_gene(...)`, `artefacts.load_gene(...)`,
`artefacts.descendant_config(...)`."""
from jlearngene.artefacts.checkpoints import (check_descendant_outputs, save_model_gene,
                                              save_run_gene, write_descendant)
from jlearngene.artefacts.descendants import (FLAGS, NoDescendant, base_config, capabilities,
                                              descendant_config, describe, made_summary,
                                              takes_option)
from jlearngene.artefacts.gene_file import (ARRAYS_FILE, FORMAT, FORMAT_VERSION, META_FILE,
                                            GeneFileError, check_arrays, check_gene_output,
                                            checksum, configs, gene_shapes, has_checksums,
                                            jsonable, load_gene, n_params, read_meta, save_gene)

__all__ = ['check_descendant_outputs', 'check_gene_output', 'save_model_gene', 'save_run_gene',
           'write_descendant', 'FLAGS', 'NoDescendant',
           'base_config', 'capabilities', 'descendant_config', 'describe', 'made_summary',
           'takes_option', 'ARRAYS_FILE', 'FORMAT', 'FORMAT_VERSION', 'META_FILE',
           'GeneFileError', 'check_arrays', 'checksum', 'configs', 'gene_shapes',
           'has_checksums', 'jsonable', 'load_gene', 'n_params', 'read_meta', 'save_gene']
