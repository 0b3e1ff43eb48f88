# Refusals: exit code 2 (3 for an operating-system error), one line naming the
# problem, no model file (expect_error.sh), through the real binary. The rules of
# TrainConfig::validate() and orpheus train's flag table are unit tests
# (tests/engine/config_test.cc, flags_test.cc); here one of each kind goes through
# orpheus and mpiexec: a validate() rule that needs P (bad_flag_fanout), a numeric
# flag (bad_flag_average_every), an enum (bad_flag_optimizer_name), an unknown flag,
# a config file, the data readers, the loss language and the job's own checks.
set(BADOUT ${ORPHEUS_TEST_WORKDIR}/bad_input_model.h5)
set(EXPECT ${E2E}/expect_error.sh)
set(TRAIN_NP1 ${ORPHEUS_BIN} train --progress off --clocks 5 --batch 2 --save ${BADOUT})
set(TRAIN_NP2 ${ORPHEUS_MPIEXEC} -n 2 --oversubscribe ${ORPHEUS_BIN} train --progress off --clocks 5 --batch 2 --save ${BADOUT})
set(TRAIN_NP4 ${ORPHEUS_MPIEXEC} -n 4 --oversubscribe ${ORPHEUS_BIN} train --progress off --clocks 5 --batch 2 --save ${BADOUT} --train ${FIX}/small.libsvm)

# Refusals that protect the user's files and the job's promises (restore into its own
# checkpoint, unmeetable byte budgets, data the model cannot read, simulate's flags).
orpheus_script_test(bad_input_hardening LABEL mpi COMMAND ${E2E}/hardening.sh ${ORPHEUS_BIN} ${ORPHEUS_MPIEXEC})
# --device cuda where it cannot run (no plugin, or no GPU): one line naming --device.
orpheus_script_test(bad_device_cuda_unavailable LABEL unit
  COMMAND env ORPHEUS_CUDA_PLUGIN=${ORPHEUS_TEST_WORKDIR}/no_such_plugin.so
    ${EXPECT} "--device cuda: this build has no CUDA backend" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --device cuda)
orpheus_script_test(bad_device_name LABEL unit
  COMMAND ${EXPECT} "--device: unknown device 'tpu'" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --device tpu --save ${BADOUT})
orpheus_script_test(bad_input_unknown_flag LABEL unit
  COMMAND ${EXPECT} "--bogus" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --bogus 3 --save ${BADOUT})
orpheus_script_test(bad_input_missing_file LABEL mpi
  COMMAND ${EXPECT} "no_such_file.libsvm" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/no_such_file.libsvm)
orpheus_script_test(bad_input_malformed_line LABEL mpi
  COMMAND ${EXPECT} "malformed.libsvm:6" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/malformed.libsvm)
orpheus_script_test(bad_input_nan LABEL mpi
  COMMAND ${EXPECT} "nan.csv:3.*non-finite" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/nan.csv)
orpheus_script_test(bad_input_width_mismatch LABEL mpi
  COMMAND ${EXPECT} "wide.csv.* has 3 features but the training data.*has 2" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.csv --test ${FIX}/wide.csv)
orpheus_script_test(bad_input_sparse_width LABEL mpi
  COMMAND ${EXPECT} "wide.libsvm" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --test ${FIX}/wide.libsvm)
orpheus_script_test(bad_input_label_range LABEL mpi
  COMMAND ${EXPECT} "label7.libsvm.*label 7" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --test ${FIX}/label7.libsvm)
orpheus_script_test(bad_input_classes_flag LABEL mpi
  COMMAND ${EXPECT} "label 2.*--classes is 2" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --classes 2)
orpheus_script_test(bad_input_bad_transfer LABEL unit
  COMMAND ${EXPECT} "--transfer: expected one of staged,sync, got 'async'" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --transfer async)
orpheus_script_test(bad_input_bad_sync LABEL unit
  COMMAND ${EXPECT} "--sync" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --sync gossip)
orpheus_script_test(bad_flag_transport LABEL unit
  COMMAND ${EXPECT} "transport 'x' is not built. available: mpi" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --transport x)
orpheus_script_test(bad_input_eval_width LABEL unit
  COMMAND ${EXPECT} "test data.*has 3 features but the model" - -- ${ORPHEUS_BIN} eval --params ${FIX}/mlr_small.h5 --test ${FIX}/wide.csv)
# Models as loss expressions that cannot be trained.
orpheus_script_test(bad_loss_syntax LABEL mpi
  COMMAND ${EXPECT} "syntax.loss:4:[0-9]+: expected" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --model ${LOSSFIX}/syntax.loss)
orpheus_script_test(bad_loss_shape LABEL mpi
  COMMAND ${EXPECT} "shape.loss:4:.*'W \\* x'.*3x3.*4 rows" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --model ${LOSSFIX}/shape.loss)
orpheus_script_test(bad_loss_no_sv_form LABEL mpi
  COMMAND ${EXPECT} "parameter 'c' has no SV form" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --model ${LOSSFIX}/nosv.loss)
# Hostile input: sizes that cannot fit, runaway nesting and step counts, repeated
# statements. Each ends in exit 2 and one line, never a crash or bad_alloc.
orpheus_script_test(bad_input_huge_index LABEL mpi
  COMMAND ${EXPECT} "MLR weights of 10x2147483647 floats.*needs" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/huge_index.libsvm)
orpheus_script_test(bad_loss_huge_dim LABEL mpi
  COMMAND ${EXPECT} "huge_dim.loss:[45]:7: parameter 'W[12]' of (1000000000x4|1000x1000000000) floats needs" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/huge_dim.loss)
orpheus_script_test(bad_loss_deep LABEL mpi
  COMMAND ${EXPECT} "deep.loss:4:[0-9]+: expression nested more than 256 levels deep" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/deep.loss)
orpheus_script_test(bad_loss_second_loss LABEL mpi
  COMMAND ${EXPECT} "two_losses.loss:5:1: second 'loss' statement. the first is at line 4" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/two_losses.loss)
orpheus_script_test(bad_loss_no_params LABEL mpi
  COMMAND ${EXPECT} "no_params.loss: the model declares no parameters" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/no_params.loss)
orpheus_script_test(bad_loss_endless_steps LABEL mpi
  COMMAND ${EXPECT} "endless_steps.loss:3:[0-9]+: 's' asks for 1000000000 inner steps per clock. at most 10000" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/endless_steps.loss)
orpheus_script_test(bad_loss_overflow_dim LABEL unit
  COMMAND ${EXPECT} "overflow_dim.loss:2:[0-9]+: size too large" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/overflow_dim.loss)
orpheus_script_test(bad_loss_float_range_init LABEL unit
  COMMAND ${EXPECT} "float_range_init.loss:1:[0-9]+: constant[(][)]: 1e.39 is beyond the range of a float" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/float_range_init.loss)
orpheus_script_test(bad_loss_negative_scale LABEL unit
  COMMAND ${EXPECT} "negative_scale.loss:1:[0-9]+: normal[(][)]: the scale -1 must not be negative" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --model ${LOSSFIX}/negative_scale.loss)
# --select-unit step: one SV column a (example, step) pair holds one site of each matrix.
orpheus_script_test(bad_loss_twice_a_step LABEL mpi
  COMMAND ${EXPECT} "--select-unit step needs every matrix used once a step: model '.*twice_a_step.loss' uses 'U' at 8 sites of a clock and 'E' at 4" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.tokens --model ${LOSSFIX}/twice_a_step.loss --select-unit step)
orpheus_script_test(bad_flag_sv_rank_batch LABEL unit
  COMMAND ${EXPECT} "--sv-rank 2 sends 3 SVGs per matrix, no fewer than the 2 a clock sends at --batch 2 without it: --sv-rank needs --batch 3 or more" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.libsvm --sv-rank 2)
orpheus_script_test(bad_flag_sv_rank_batch3 LABEL unit
  COMMAND ${EXPECT} "no fewer than the 3 a clock sends at --batch 3 without it: give --sv-rank 1 or less" ${BADOUT} -- ${ORPHEUS_BIN} train --progress off --clocks 5 --batch 3 --save ${BADOUT} --train ${FIX}/small.libsvm --sv-rank 2)
orpheus_script_test(bad_flag_sv_rank_example_columns LABEL unit
  COMMAND ${EXPECT} "--sv-rank 8 sends 9 SVGs per matrix, no fewer than the B.T = 8 a clock sends without it .2 examples of 4 steps.: give --sv-rank 6 or less" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.tokens --model ${CMAKE_SOURCE_DIR}/examples/lstm.loss --sv-rank 8)
orpheus_script_test(bad_flag_sv_rank_step_columns LABEL unit
  COMMAND ${EXPECT} "--sv-rank 2147483647 sends 2147483648 SVGs per matrix, no fewer than the B.T = 8 a clock sends without it .2 examples of 4 steps.: give --sv-rank 6 or less" ${BADOUT} -- ${TRAIN_NP1} --train ${FIX}/small.tokens --model ${CMAKE_SOURCE_DIR}/examples/lstm.loss --sv-rank 2147483647 --select-unit step)
file(WRITE ${ORPHEUS_TEST_WORKDIR}/bad_bool.toml "[train]\nresume = \"maybe\"\n")
orpheus_script_test(bad_flag_bool_config LABEL unit
  COMMAND ${EXPECT} "--resume = maybe .from --config '.*bad_bool.toml'." ${BADOUT} -- ${ORPHEUS_BIN} --config ${ORPHEUS_TEST_WORKDIR}/bad_bool.toml train --train ${FIX}/small.libsvm)
# A label past the model's fixed label rows: refused before the first clock, one line at np 2.
orpheus_script_test(bad_loss_fixed_label LABEL mpi
  COMMAND ${EXPECT} "--train '.*small.libsvm' has label 2, but model '.*fixed_label.loss' takes labels 0..1 .label y.2.." ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --model ${LOSSFIX}/fixed_label.loss)
# validate() on the ranks mpiexec started.
orpheus_script_test(bad_flag_fanout LABEL mpi
  COMMAND ${EXPECT} "--fanout 4 needs at most P-1 = 3" ${BADOUT} -- ${TRAIN_NP4} --multicast random --fanout 4)
# A numeric flag out of its range (engine/cli/flags.h).
orpheus_script_test(bad_flag_average_every LABEL unit
  COMMAND ${EXPECT} "--average-every: must be an integer >= 1, got 0" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --average-every 0)
# --inject-delay parsed strictly, on the command line and from a config file.
orpheus_script_test(bad_flag_inject_delay LABEL unit
  COMMAND ${EXPECT} "--inject-delay: MS must be a whole number.*'xyz'" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --inject-delay 0:xyz)
orpheus_script_test(bad_flag_inject_delay_range LABEL unit
  COMMAND ${EXPECT} "--inject-delay: MS must be a whole number.*'99999999999'" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --inject-delay 0:99999999999)
file(WRITE ${ORPHEUS_TEST_WORKDIR}/inject_delay.toml "[train]\ninject-delay = \"x:5\"\n")
orpheus_script_test(bad_flag_inject_delay_config LABEL unit
  COMMAND ${EXPECT} "--inject-delay: RANK must be a whole number.*'x'.* .from --config '.*inject_delay.toml'." ${BADOUT} -- ${ORPHEUS_BIN} --config ${ORPHEUS_TEST_WORKDIR}/inject_delay.toml train --train ${FIX}/small.libsvm)
# A file operation the operating system refuses (a full device) exits 3, not 2.
orpheus_script_test(io_error_metrics_full_device LABEL mpi
  COMMAND env EXPECT_CODE=3 ${EXPECT} "cannot write metrics file '/dev/full': No space left on device" ${BADOUT} -- ${TRAIN_NP2} --train ${FIX}/small.libsvm --metrics /dev/full)
# What a job cannot hold in memory is refused before the first clock.
orpheus_script_test(bad_flag_batch_too_large LABEL mpi
  COMMAND ${EXPECT} "--batch 2000000000: three minibatches.*needs" ${BADOUT} -- ${ORPHEUS_MPIEXEC} -n 2 --oversubscribe
          ${ORPHEUS_BIN} train --progress off --clocks 5 --batch 2000000000 --save ${BADOUT}
          --train synthetic:examples=100,features=784,classes=10)
# An optimizer name orpheus does not know.
orpheus_script_test(bad_flag_optimizer_name LABEL unit
  COMMAND ${EXPECT} "--optimizer" ${BADOUT} -- ${ORPHEUS_BIN} train --train ${FIX}/small.libsvm --optimizer lbfgs)
# The quasi-Newton optimizers: what only the data and the model decide.
orpheus_script_test(bad_flag_bfgs_model_too_large LABEL mpi
  COMMAND ${EXPECT} "--optimizer bfgs: model 'mlr' has 6003 parameter entries" ${BADOUT} -- ${TRAIN_NP2}
          --train synthetic:examples=10,features=2000,classes=3 --optimizer bfgs)
