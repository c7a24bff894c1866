// Runs an AOTInductor package (.pt2) from C++ with no Python in the process: the test
// of fusedmlp_xpu's deployment through AOTInductor (tests/test_deploy.py builds it with
// g++ against the torch wheel's headers and libraries).
//
//   aoti_run PACKAGE INPUTS OUTPUTS
//
// INPUTS: a file torch.save wrote in Python holding a list of lists of tensors, one
// inner list per call of the model (calls of other batch sizes: the package's dynamic
// shapes). OUTPUTS: the outputs of each call, the same nesting, for torch.load.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

static std::vector<char> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("cannot open ") + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " PACKAGE INPUTS OUTPUTS\n";
    return 2;
  }
  try {
    torch::inductor::AOTIModelPackageLoader loader(argv[1]);
    c10::IValue calls = torch::jit::pickle_load(read_file(argv[2]));
    c10::List<c10::List<at::Tensor>> results;
    for (const c10::IValue& call : calls.toListRef()) {
      std::vector<at::Tensor> inputs;
      for (const c10::IValue& t : call.toListRef()) inputs.push_back(t.toTensor());
      c10::List<at::Tensor> outputs;
      for (const at::Tensor& y : loader.run(inputs)) outputs.push_back(y);
      results.push_back(outputs);
    }
    std::vector<char> bytes = torch::jit::pickle_save(results);
    std::ofstream(argv[3], std::ios::binary).write(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    std::cerr << "aoti_run: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
