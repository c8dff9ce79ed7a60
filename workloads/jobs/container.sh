# Sourced by the job scripts once they are in the code folder. With FT_CONTAINER_IMAGE set (the stack's environment
# source is `container`) every Python step runs in that image through Pyxis (github.com/NVIDIA/pyxis, v0.24.0 README):
# the jail folders in FT_CONTAINER_MOUNTS (SRC:DST,...: the code, the environments, the run's folders) bound at the
# same paths, so the environment's interpreter (a venv over the image's Python) resolves inside; the code folder as
# the working directory; the user's home not mounted. Each folder is made first (a bind mount needs its source).
# Unset, both arrays are empty and the steps run as before.
#   ft_container: srun flags that put a step in the image;  ft_step: prefix that runs one task on this node in it.
ft_container=()
ft_step=()
if [ -n "${FT_CONTAINER_IMAGE:-}" ]; then
  ft_container=(--container-image="$FT_CONTAINER_IMAGE"
                --container-mounts="${FT_CONTAINER_MOUNTS:?FT_CONTAINER_MOUNTS: give the jail folders the step uses}"
                --container-workdir="$PWD" --no-container-mount-home)
  IFS=, read -r -a ft_mounts <<< "$FT_CONTAINER_MOUNTS"
  for ft_mount in "${ft_mounts[@]}"; do mkdir -p "${ft_mount%%:*}"; done
  ft_step=(srun --nodes=1 --ntasks=1 "${ft_container[@]}")
fi
