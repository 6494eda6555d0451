# The Kubernetes manifests (deploy/k8s): every variant rendered with kubectl
# kustomize and checked offline by k8s_validate.py (the Kubernetes schemas
# through kubernetes-validate, our LeaderWorkerSet schema, yamllint,
# ferrum's own rules, negative cases); serve's and ferrum-worker's flags are
# checked against the built programs. Skipped (77) without kubectl 1.27+.
add_test(NAME k8s_validate COMMAND ${FERRUM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/k8s_validate.py)
set_tests_properties(k8s_validate PROPERTIES LABELS deploy SKIP_RETURN_CODE 77 TIMEOUT 300
  ENVIRONMENT "FERRUMCTL=$<TARGET_FILE:ferrumctl>;FERRUM_WORKER=$<TARGET_FILE:ferrum-worker>")
