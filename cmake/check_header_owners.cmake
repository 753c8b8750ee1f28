# ctest installed_headers_linked: every installed header (cmake/public_headers.cmake) whose
# definitions live in a library (the .cpp of the same name, in the same folder, is a source of that
# library) belongs to a library `cmake --install` installs and exports, so a user program that
# includes it links; a .cpp of its name that no library compiles fails too. Header-only headers
# (no .cpp of their name) need no library. Definitions in a .cpp of another name are not seen.
# Run as: cmake -DOWNERS=<build>/qforge_header_owners.cmake -P cmake/check_header_owners.cmake
# (OWNERS, written at configure time, sets QFORGE_SOURCE_OWNERS: "source.cpp=target" pairs, and
# QFORGE_INSTALLED_LIBRARIES.)
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/public_headers.cmake)
include(${OWNERS})
set(problems "")
set(owned 0)
foreach(header IN LISTS QFORGE_PUBLIC_HEADERS)
  string(REGEX REPLACE "\\.h$" ".cpp" source "${header}")
  set(owner "")
  foreach(pair IN LISTS QFORGE_SOURCE_OWNERS)
    if(pair MATCHES "^${source}=(.+)$")
      list(APPEND owner ${CMAKE_MATCH_1})
    endif()
  endforeach()
  # A .cpp of the header's name that no library compiles: its definitions link nowhere.
  if(NOT owner AND EXISTS "${CMAKE_CURRENT_LIST_DIR}/../${source}")
    string(APPEND problems "  ${header}: ${source} exists but no library target compiles it\n")
  endif()
  foreach(target IN LISTS owner)
    math(EXPR owned "${owned} + 1")
    if(NOT target IN_LIST QFORGE_INSTALLED_LIBRARIES)
      string(APPEND problems "  ${header}: its definitions (${source}) are in ${target}, which is not installed\n")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "installed headers whose library the package does not export (add the library "
                      "to QFORGE_EXPORTED or QFORGE_COMPONENTS in CMakeLists.txt, or keep the header "
                      "out of cmake/public_headers.cmake):\n${problems}")
endif()
list(LENGTH QFORGE_PUBLIC_HEADERS count)
message(STATUS "installed headers linked: ${count} headers, ${owned} with a library, every one installed")
