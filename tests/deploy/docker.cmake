# Container images (deploy/docker): hadolint on the Dockerfiles, and the CPU
# image serving the real model (deploy/image.sh builds it; the test skips
# until it has). Shell scripts, not Check programs: they drive podman.
add_test(NAME test_dockerfile_lint COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/lint_dockerfiles.sh)
add_test(NAME test_image_cpu COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/test_image.sh)
set_tests_properties(test_dockerfile_lint test_image_cpu PROPERTIES LABELS deploy SKIP_RETURN_CODE 77
  TIMEOUT 300
  ENVIRONMENT "FERRUM_MODEL=${FERRUM_MODEL};FERRUM_SOURCE_DIR=${CMAKE_SOURCE_DIR};FERRUM_BUILD_DIR=${CMAKE_BINARY_DIR};FERRUM_PYTHON=${FERRUM_PYTHON}")
