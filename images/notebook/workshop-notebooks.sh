#!/bin/bash
# docker-stacks start hook (before-notebook.d): copy the workshop's notebooks into the participant's
# workspace, new ones and updates to those they have not changed; never over their edits.
workshop notebooks --dir "${WORKSHOP_WORKSPACE:-${HOME}/work}" \
  || echo "workshop: could not copy the notebooks into ${WORKSHOP_WORKSPACE:-${HOME}/work}; they are in /opt/workshop/notebooks"
