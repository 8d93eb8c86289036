#!/usr/bin/env bash
# The TensorFlow image's checks, run by hand until the suite builds that image (docs/build.md, "The TensorFlow
# image"): its Horovod build, then the four Keras checks of tests/tensorflow/ on 2 ranks over Gloo through the
# image's smoke role, as a CI job would run a user's script. Each check fails unless every rank ends with the same
# weights; Keras 2's run with TF_USE_LEGACY_KERAS=1, as the Keras team documents.
#   scripts/check-tensorflow-image.sh        (TENSORFLOW_IMAGE overrides horovod-stack:tensorflow)
set -euo pipefail
cd "$(dirname "$0")/.."
image="${TENSORFLOW_IMAGE:-horovod-stack:tensorflow}"
if ! docker image inspect "$image" >/dev/null 2>&1; then
  echo "check-tensorflow-image: no $image here; build it first: scripts/build-images.sh tensorflow" >&2
  exit 1
fi
docker run --rm "$image" horovodrun --check-build
failed=0
for check in keras3_tape keras3_fit keras2_tape keras2_fit; do
  keras=()
  [[ "$check" == keras2_* ]] && keras=(-e TF_USE_LEGACY_KERAS=1)
  echo "=== $check${keras[*]:+ (TF_USE_LEGACY_KERAS=1)}"
  docker run --rm "${keras[@]}" -v "$PWD/tests/tensorflow:/workdir:ro" -w /workdir "$image" \
    smoke --np 2 -- python "$check.py" || failed=$((failed + 1))
done
[ "$failed" = 0 ] || { echo "check-tensorflow-image: $failed of 4 checks failed" >&2; exit 1; }
echo "check-tensorflow-image: 4 of 4 checks passed on $image"
